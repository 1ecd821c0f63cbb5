"""Compute instructions against NumPy, and their documented restrictions."""

import numpy as np
import pytest

import simulate
from simulate import jit, nisa, nl


def run(body, *arrays, target=None):
    """Run ``body(*sbuf_tiles) -> sbuf tile`` in a kernel: inputs DMA'd to SBUF, result back."""
    @jit
    def kernel(*hbm):
        tiles = []
        for a in hbm:
            t = nl.ndarray(a.shape, a.dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=t, src=a)
            tiles.append(t)
        res = body(*tiles)
        out = nl.ndarray(res.shape, res.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=res)
        return out
    return simulate.simulate(kernel, target=target)(*arrays)


def sb(shape, dtype=nl.float32):
    return nl.ndarray(shape, dtype, buffer=nl.sbuf)


def test_tensor_tensor_and_scalar(rng):
    a, b = rng.standard_normal((2, 37, 19)).astype(np.float32)

    def body(x, y):
        t, u = sb(x.shape), sb(x.shape)
        nisa.tensor_tensor(dst=t, data1=x, data2=y, op=nl.subtract)
        nisa.tensor_scalar(dst=u, data=t, op0=nl.multiply, operand0=2.0, op1=nl.add, operand1=1.0)
        return u
    np.testing.assert_allclose(run(body, a, b), (a - b) * 2 + 1, rtol=1e-6)


def test_tensor_scalar_reverse_and_tile_operand(rng):
    a = rng.standard_normal((5, 7)).astype(np.float32)
    col = rng.standard_normal((5, 1)).astype(np.float32)

    def body(x, c):
        t = sb(x.shape)
        nisa.tensor_scalar(dst=t, data=x, op0=nl.subtract, operand0=c, reverse0=True)
        return t
    np.testing.assert_allclose(run(body, a, col), col - a, rtol=1e-6)


def test_integer_math_is_exact():
    a = np.array([[2 ** 30, 7]], np.int32)

    def body(x):
        t = sb(x.shape, nl.int32)
        nisa.tensor_scalar(dst=t, data=x, op0=nl.add, operand0=1)
        return t
    np.testing.assert_array_equal(run(body, a), a + 1)


@pytest.mark.parametrize("op, ref", [(nl.maximum, np.max), (nl.add, np.sum), (nl.minimum, np.min)])
def test_tensor_reduce(rng, op, ref):
    a = rng.standard_normal((9, 4, 33)).astype(np.float32)

    def body(x):
        t = sb((9, 4))
        nisa.tensor_reduce(dst=t, op=op, data=x, axis=2)
        return t
    np.testing.assert_allclose(run(body, a), ref(a, axis=2), rtol=1e-5, atol=1e-5)


def test_tensor_reduce_refuses_leading_axis():
    def body(x):
        t = sb((3, 5))
        nisa.tensor_reduce(dst=t, op=nl.add, data=x, axis=1)
        return t
    with pytest.raises(simulate.ValidationError, match="must be the last free axes"):
        run(body, np.zeros((3, 4, 5), np.float32))


def test_activation_with_bias_scale_and_reduce(rng):
    a = rng.standard_normal((16, 40)).astype(np.float32)
    bias = rng.standard_normal((16, 1)).astype(np.float32)

    def body(x, b):
        e, s = sb(x.shape), sb((16, 1))
        nisa.activation(dst=e, op=nl.exp, data=x, bias=b, scale=0.5, reduce_op=nl.add,
                        reduce_res=s, reduce_cmd=nisa.reduce_cmd.reset_reduce)
        return s
    np.testing.assert_allclose(run(body, a, bias), np.exp(a * 0.5 + bias).sum(1, keepdims=True),
                               rtol=1e-5)


def test_activation_scalar_bias_needs_v3():
    def body(x):
        t = sb(x.shape)
        nisa.activation(dst=t, op=nl.exp, data=x, bias=1.0)
        return t
    run(body, np.zeros((2, 2), np.float32), target="trn2")
    with pytest.raises(simulate.ValidationError, match="scalar bias needs NeuronCore-v3"):
        run(body, np.zeros((2, 2), np.float32), target="trn1")


def test_matmul_accumulates_in_psum(rng):
    aT = rng.standard_normal((256, 96)).astype(np.float32)
    b = rng.standard_normal((256, 200)).astype(np.float32)

    def body(a0, b0):
        acc = nl.ndarray((96, 200), nl.float32, buffer=nl.psum)
        for k in range(2):
            nisa.nc_matmul(dst=acc, stationary=a0[:, k, :], moving=b0[:, k, :])
        res = sb((96, 200))
        nisa.tensor_copy(dst=res, src=acc)
        return res
    a3 = aT.reshape(2, 128, 96).transpose(1, 0, 2).copy()      # [128, k, M]
    b3 = b.reshape(2, 128, 200).transpose(1, 0, 2).copy()
    np.testing.assert_allclose(run(body, a3, b3), aT.T @ b, rtol=1e-4, atol=1e-4)


def test_matmul_bf16_inputs(rng):
    import ml_dtypes
    a = rng.standard_normal((64, 8)).astype(ml_dtypes.bfloat16)
    b = rng.standard_normal((64, 16)).astype(ml_dtypes.bfloat16)

    def body(x, y):
        acc = nl.ndarray((8, 16), nl.float32, buffer=nl.psum)
        nisa.nc_matmul(dst=acc, stationary=x, moving=y)
        res = sb((8, 16))
        nisa.tensor_copy(dst=res, src=acc)
        return res
    ref = a.astype(np.float32).T @ b.astype(np.float32)
    np.testing.assert_allclose(run(body, a, b), ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("shapes, match", [
    (((128, 129), (128, 8), (128, 8)), "stationary free size M=129 exceeds 128"),
    (((4, 4), (4, 513), (4, 513)), "moving free size N=513 exceeds 512"),
    (((4, 4), (5, 8), (4, 8)), "contraction"),
])
def test_matmul_limits(shapes, match):
    (ks, m), (km, n), (dm, dn) = shapes

    def body(x, y):
        acc = nl.ndarray((dm, dn), nl.float32, buffer=nl.psum)
        nisa.nc_matmul(dst=acc, stationary=x, moving=y)
        return x
    with pytest.raises(simulate.ValidationError, match=match):
        run(body, np.zeros((ks, m), np.float32), np.zeros((km, n), np.float32))


def test_matmul_fp32_pairs_with_fp32_and_accumulate_true_needs_group():
    import ml_dtypes

    def mixed(x, y):
        acc = nl.ndarray((4, 4), nl.float32, buffer=nl.psum)
        nisa.nc_matmul(dst=acc, stationary=x, moving=y)
        return x
    with pytest.raises(simulate.ValidationError, match="fp32 must pair with fp32"):
        run(mixed, np.zeros((4, 4), np.float32), np.zeros((4, 4), ml_dtypes.bfloat16))

    def after_memset(x, y):
        acc = nl.ndarray((4, 4), nl.float32, buffer=nl.psum)
        nisa.memset(dst=acc, value=0.0)
        nisa.nc_matmul(dst=acc, stationary=x, moving=y, accumulate=True)
        return x
    with pytest.raises(simulate.ValidationError, match="undefined on NeuronCore-v2/v3"):
        run(after_memset, np.zeros((4, 4), np.float32), np.zeros((4, 4), np.float32))


def test_transpose_tensor_and_vector(rng):
    a = rng.standard_normal((100, 37)).astype(np.float32)

    def body(x):
        p = nl.ndarray((37, 100), nl.float32, buffer=nl.psum)
        nisa.nc_transpose(dst=p, data=x)
        res = sb((37, 100))
        nisa.tensor_copy(dst=res, src=p)
        return res
    np.testing.assert_array_equal(run(body, a), a.T)

    def vec(x):
        t = sb((x.shape[1], x.shape[0]))
        nisa.nc_transpose(dst=t, data=x, engine=nisa.engine.vector)
        return t
    with pytest.raises(simulate.ValidationError, match="limit 32 x 32"):
        run(vec, a)


def test_affine_select_causal_mask(rng):
    a = rng.standard_normal((8, 8)).astype(np.float32)

    def body(x):
        t = sb(x.shape)
        # keep where p - j >= 0 (lower triangle)
        nisa.affine_select(dst=t, pattern=[[-1, 8]], channel_multiplier=1, on_true_tile=x,
                           on_false_value=-1e30, cmp_op=nl.greater_equal)
        return t
    np.testing.assert_array_equal(run(body, a), np.where(np.tril(np.ones((8, 8))) > 0, a, np.float32(-1e30)))


def test_iota_and_predicated_copy():
    def body(x):
        idx = sb((4, 6), nl.int32)
        nisa.iota(dst=idx, pattern=[[1, 6]], offset=0, channel_multiplier=6)
        pred = sb((4, 6), nl.uint8)
        nisa.tensor_scalar(dst=pred, data=idx, op0=nl.less, operand0=10)
        t = sb((4, 6))
        nisa.memset(dst=t, value=-1.0)
        nisa.tensor_copy_predicated(dst=t, src=x, predicate=pred)
        return t
    x = np.arange(24, dtype=np.float32).reshape(4, 6) + 100
    np.testing.assert_array_equal(run(body, x), np.where(np.arange(24).reshape(4, 6) < 10, x, -1))


def test_gpsimd_cannot_touch_psum_and_start_partition_rule():
    def body(x):
        p = nl.ndarray((4, 4), nl.float32, buffer=nl.psum)
        nisa.tensor_copy(dst=p, src=x, engine=nisa.engine.gpsimd)
        return x
    with pytest.raises(simulate.ValidationError, match="GpSimd cannot access PSUM"):
        run(body, np.zeros((4, 4), np.float32))

    def misaligned(x):
        t = sb((8, 4))
        nisa.tensor_copy(dst=t[1:5, :], src=x[0:4, :])
        return t
    with pytest.raises(simulate.ValidationError, match="starts at partition 1"):
        run(misaligned, np.zeros((8, 4), np.float32))


def test_range_select_and_partition_reduce(rng):
    a = rng.standard_normal((3, 10)).astype(np.float32)

    def body(x):
        t = sb(x.shape)
        nisa.range_select(dst=t, on_true_tile=x, comp_op0=nl.greater_equal, comp_op1=nl.less,
                          bound0=2, bound1=5)
        s = sb((1, 10))
        nisa.tensor_partition_reduce(dst=s, op=nl.add, data=x)
        return t
    out = run(body, a, target="trn2")
    keep = (np.arange(10) >= 2) & (np.arange(10) < 5)
    np.testing.assert_array_equal(out, np.where(keep, a, np.float32(-3.4028235e38)))
    with pytest.raises(simulate.TargetError, match="NeuronCore-v3"):
        run(body, a, target="trn1")
