"""Whole kernels from the documented recipes (nki-api.md §6), in Beta 2 ISA calls, vs NumPy:
a row softmax and a tiled matmul accumulating K-tiles in PSUM."""

import ml_dtypes
import numpy as np
import pytest

from nki_kernels import simulate
from nki_kernels.simulate import jit, nisa, nl


@jit
def row_softmax(x):
    """x [R, F] @ HBM -> softmax over F, rows in tiles of <= 128 partitions."""
    R, F = x.shape
    out = nl.ndarray((R, F), x.dtype, buffer=nl.shared_hbm, name="out")
    for r0 in range(0, R, nl.tile_size.pmax):
        p = min(nl.tile_size.pmax, R - r0)
        t = nl.ndarray((p, F), x.dtype, buffer=nl.sbuf, name="x")
        nisa.dma_copy(dst=t, src=x[r0:r0 + p, :])
        negmax = nl.ndarray((p, 1), nl.float32, buffer=nl.sbuf, name="negmax")
        nisa.tensor_reduce(dst=negmax, op=nl.maximum, data=t, axis=1, negate=True, keepdims=True)
        e = nl.ndarray((p, F), nl.float32, buffer=nl.sbuf, name="e")
        total = nl.ndarray((p, 1), nl.float32, buffer=nl.sbuf, name="sum")
        nisa.activation(dst=e, op=nl.exp, data=t, bias=negmax, reduce_op=nl.add,
                        reduce_res=total, reduce_cmd=nisa.reduce_cmd.reset_reduce)
        nisa.reciprocal(dst=total, data=total)
        y = nl.ndarray((p, F), x.dtype, buffer=nl.sbuf, name="y")
        nisa.tensor_scalar(dst=y, data=e, op0=nl.multiply, operand0=total)
        nisa.dma_copy(dst=out[r0:r0 + p, :], src=y)
    return out


def softmax_ref(x):
    x = x.astype(np.float64)
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


@pytest.mark.parametrize("shape, dtype, tol", [((1, 1), np.float32, 1e-6),
                                               ((37, 129), np.float32, 1e-6),
                                               ((200, 64), ml_dtypes.bfloat16, 1e-2)])
def test_row_softmax(rng, target, shape, dtype, tol):
    x = (rng.standard_normal(shape) * 4).astype(dtype)
    out = row_softmax(x)
    assert out.dtype == dtype
    np.testing.assert_allclose(out.astype(np.float64), softmax_ref(x), rtol=tol, atol=tol)
    counts = simulate.last_trace().count_by_engine()
    tiles = -(-shape[0] // 128)
    assert counts["scalar"] == tiles and counts["vector"] == 3 * tiles


@jit
def tiled_matmul(lhsT, rhs):
    """lhsT [K, M] (A pre-transposed, K on partitions), rhs [K, N] -> A @ rhs [M, N] fp32.
    K in 128-row tiles accumulated in one PSUM tile, M in 128-column and N in 512-column tiles."""
    K, M = lhsT.shape
    N = rhs.shape[1]
    out = nl.ndarray((M, N), nl.float32, buffer=nl.shared_hbm, name="out")
    TK, TM, TN = nl.tile_size.pmax, nl.tile_size.gemm_stationary_fmax, nl.tile_size.gemm_moving_fmax
    for m0 in range(0, M, TM):
        m = min(TM, M - m0)
        for n0 in range(0, N, TN):
            n = min(TN, N - n0)
            acc = nl.ndarray((m, n), nl.float32, buffer=nl.psum, name="acc")
            for k0 in range(0, K, TK):
                k = min(TK, K - k0)
                a = nl.ndarray((k, m), lhsT.dtype, buffer=nl.sbuf, name="a")
                nisa.dma_copy(dst=a, src=lhsT[k0:k0 + k, m0:m0 + m])
                b = nl.ndarray((k, n), rhs.dtype, buffer=nl.sbuf, name="b")
                nisa.dma_copy(dst=b, src=rhs[k0:k0 + k, n0:n0 + n])
                nisa.nc_matmul(dst=acc, stationary=a, moving=b, accumulate=k0 > 0)
            res = nl.ndarray((m, n), nl.float32, buffer=nl.sbuf, name="res")
            nisa.tensor_copy(dst=res, src=acc)
            nisa.dma_copy(dst=out[m0:m0 + m, n0:n0 + n], src=res)
    return out


@pytest.mark.parametrize("K, M, N, dtype", [(256, 128, 512, np.float32),
                                            (256, 96, 512, ml_dtypes.bfloat16),
                                            (300, 130, 600, np.float32)])
def test_tiled_matmul(rng, target, K, M, N, dtype):
    lhsT = rng.standard_normal((K, M)).astype(dtype)
    rhs = rng.standard_normal((K, N)).astype(dtype)
    out = tiled_matmul(lhsT, rhs)
    ref = lhsT.astype(np.float64).T @ rhs.astype(np.float64)
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4)
    mm = [e for e in simulate.last_trace() if e.op == "nc_matmul"]
    tiles = -(-K // 128) * -(-M // 128) * -(-N // 512)
    assert len(mm) == tiles and sum(e.flops for e in mm) == 2 * K * M * N
