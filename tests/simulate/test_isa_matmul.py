"""TensorE: nc_matmul and nc_transpose against NumPy, accumulation groups, documented limits."""

import ml_dtypes
import numpy as np
import pytest

from nki_kernels import simulate
from nki_kernels.simulate import nisa, nl

from .isa_util import events, ps, randn, run, sb

F8 = ml_dtypes.float8_e5m2


def matmul_body(dst_shape=None, dst_dtype=nl.float32, **kw):
    def body(a, b):
        shape = dst_shape or (a.shape[-1], b.shape[-1])
        acc = ps(shape, dst_dtype)
        nisa.nc_matmul(dst=acc, stationary=a, moving=b, **kw)
        return acc
    return body


@pytest.mark.parametrize("K, M, N", [(1, 1, 1), (37, 19, 45), (128, 128, 512), (5, 128, 7)])
def test_matmul_matches_numpy(rng, target, K, M, N):
    a, b = randn(rng, K, M), randn(rng, K, N)
    out = run(matmul_body(), a, b, target=target)
    np.testing.assert_allclose(out, a.astype(np.float64).T @ b, rtol=1e-5, atol=1e-5)
    (e,) = events("nc_matmul")
    assert (e.engine, e.partitions, e.free_elems, e.flops) == ("tensor", K, N, 2 * K * M * N)
    assert e.details["M"] == M and [o.role for o in e.operands] == ["dst", "stationary", "moving"]


def test_matmul_low_precision_inputs_accumulate_in_fp32(rng):
    a = randn(rng, 64, 9).astype(ml_dtypes.bfloat16)
    b = randn(rng, 64, 17).astype(F8)
    ref = a.astype(np.float64).T @ b.astype(np.float64)
    np.testing.assert_allclose(run(matmul_body(), a, b), ref, rtol=1e-5, atol=1e-5)


def test_accumulation_groups(rng):
    """auto: first matmul into an element overwrites, later ones add; False overwrites; True adds;
    a write by another instruction (tensor_copy) ends the group."""
    a, b = randn(rng, 8, 3), randn(rng, 8, 5)
    c = randn(rng, 3, 5)

    def body(x, y, z):
        acc = ps((3, 5))
        nisa.nc_matmul(dst=acc, stationary=x, moving=y)                    # = p
        nisa.nc_matmul(dst=acc, stationary=x, moving=y)                    # = 2p
        nisa.nc_matmul(dst=acc, stationary=x, moving=y, accumulate=True)   # = 3p
        r1 = sb((3, 5))
        nisa.tensor_copy(dst=r1, src=acc)
        nisa.nc_matmul(dst=acc, stationary=x, moving=y, accumulate=False)  # = p
        r2 = sb((3, 5))
        nisa.tensor_copy(dst=r2, src=acc)
        nisa.tensor_copy(dst=acc, src=z)                                   # group ends
        nisa.nc_matmul(dst=acc, stationary=x, moving=y)                    # auto: overwrite = p
        return r1, r2, acc
    r1, r2, r3 = run(body, a, b, c)
    p = a.T @ b
    np.testing.assert_allclose(r1, 3 * p, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(r2, p, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(r3, p, rtol=1e-5, atol=1e-5)


def test_auto_accumulation_starts_afresh_in_a_new_tensor_at_the_same_address(rng):
    """accumulate=None is decided per tensor: a new PSUM tensor placed where the last one lay
    (nki-library's attention_tkg allocates its QK PSUM per batch this way) overwrites on its
    first matmul, though the bytes were last written by a matmul; within one tensor later
    matmuls still add."""
    a, b, c = randn(rng, 8, 3), randn(rng, 8, 5), randn(rng, 8, 5)

    def body(x, y, z):
        outs = []
        for moving in (y, z):
            acc = nl.ndarray((3, 5), nl.float32, buffer=nl.psum, address=(0, 0))
            nisa.nc_matmul(dst=acc, stationary=x, moving=moving)
            r = sb((3, 5))
            nisa.tensor_copy(dst=r, src=acc)
            outs.append(r)
        nisa.nc_matmul(dst=acc, stationary=x, moving=y)                   # same tensor: adds
        outs.append(acc)
        return tuple(outs)
    first, second, summed = run(body, a, b, c)
    np.testing.assert_allclose(first, a.T @ b, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(second, a.T @ c, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(summed, a.T @ c + a.T @ b, rtol=1e-5, atol=1e-5)


def test_auto_accumulation_in_a_device_loop_body_overwrites_each_iteration(rng):
    a, b = randn(rng, 8, 3), randn(rng, 8, 5)

    def body(x, y):
        total = sb((3, 5))
        nisa.memset(dst=total, value=0.0)

        def step(i):
            acc = ps((3, 5))                      # the body's tensor: one buffer, compiled once
            nisa.nc_matmul(dst=acc, stationary=x, moving=y)
            nisa.tensor_tensor(dst=total, data1=total, data2=acc, op=nl.add)
        nl.fori_loop(0, 3, step)
        return total
    np.testing.assert_allclose(run(body, a, b), 3 * (a.T @ b), rtol=1e-5, atol=1e-5)


def test_accumulate_true_after_memset_is_undefined_on_v2_v3(rng):
    a, b = randn(rng, 4, 4), randn(rng, 4, 4)

    def body(x, y):
        acc = ps((4, 4))
        nisa.memset(dst=acc, value=1.0)
        nisa.nc_matmul(dst=acc, stationary=x, moving=y, accumulate=True)
        return acc
    for target in ("trn1", "trn2"):
        with pytest.raises(simulate.ValidationError, match="accumulate=True onto PSUM not last"):
            run(body, a, b, target=target)
    np.testing.assert_allclose(run(body, a, b, target="trn3"), 1 + a.T @ b, rtol=1e-5)


@pytest.mark.parametrize("shapes, match", [
    (((128, 129), (128, 8)), "stationary free size M=129 exceeds 128"),
    (((4, 4), (4, 513)), "moving free size N=513 exceeds 512"),
    (((4, 4), (5, 8)), "contraction .* K=4, moving K=5"),
])
def test_matmul_size_limits(shapes, match):
    (k, m), (k2, n) = shapes
    with pytest.raises(simulate.ValidationError, match=match):
        run(matmul_body(dst_shape=(min(m, 128), min(n, 512))), np.zeros((k, m), np.float32),
            np.zeros((k2, n), np.float32))


def test_moving_limit_and_psum_banks_per_target():
    a, b = np.ones((2, 3), np.float32), np.ones((2, 1024), np.float32)
    with pytest.raises(simulate.ValidationError, match="N=1024 exceeds 512 on trn2"):
        run(matmul_body(), a, b, target="trn2")
    np.testing.assert_array_equal(run(matmul_body(), a, b, target="trn3"), np.full((3, 1024), 2))

    def crossing(x, y):
        acc = ps((3, 1024))
        nisa.nc_matmul(dst=acc[:, 256:768], stationary=x, moving=y)
        return x
    with pytest.raises(simulate.ValidationError, match="cross a 2048 B PSUM bank"):
        run(crossing, a, b[:, :512], target="trn2")


def test_dst_shape_and_buffers():
    a, b = np.ones((4, 3), np.float32), np.ones((4, 5), np.float32)
    with pytest.raises(simulate.ValidationError, match=r"dst \(5, 3\) must be \[M=3, N=5\]"):
        run(matmul_body(dst_shape=(5, 3)), a, b)

    def to_sbuf(x, y):
        nisa.nc_matmul(dst=sb((3, 5)), stationary=x, moving=y)
        return x
    with pytest.raises(simulate.ValidationError, match=r"nc_matmul\(dst\).*accepts psum"):
        run(to_sbuf, a, b)

    def from_psum(x, y):
        xp = ps((4, 3))
        nisa.tensor_copy(dst=xp, src=x)
        nisa.nc_matmul(dst=ps((3, 5)), stationary=xp, moving=y)
        return x
    with pytest.raises(simulate.ValidationError, match=r"nc_matmul\(stationary\).*accepts sbuf"):
        run(from_psum, a, b)


@pytest.mark.parametrize("s_dtype, m_dtype, d_dtype, target, match", [
    (np.float32, ml_dtypes.bfloat16, np.float32, "trn2", "fp32 must pair with fp32"),
    (np.int32, np.int32, np.float32, "trn2", "int32 is not a matmul input type"),
    (np.float16, np.float16, ml_dtypes.bfloat16, "trn2", "dst dtype bfloat16 must be float32"),
    (ml_dtypes.float8_e4m3fn, F8, np.float32, "trn2", "float8_e4m3fn inputs need NeuronCore-v4"),
    (ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e4m3, np.float32, "trn3", "cannot be mixed"),
])
def test_matmul_dtype_rules(s_dtype, m_dtype, d_dtype, target, match):
    a, b = np.ones((4, 3), s_dtype), np.ones((4, 5), m_dtype)
    with pytest.raises(simulate.ValidationError, match=match):
        run(matmul_body(dst_dtype=d_dtype), a, b, target=target)


def test_bf16_dst_and_ocp_fp8_on_trn3(rng):
    a = randn(rng, 6, 3).astype(ml_dtypes.float8_e4m3fn)
    b = randn(rng, 6, 5).astype(F8)
    out = run(matmul_body(dst_dtype=nl.bfloat16), a, b, target="trn3")
    ref = (a.astype(np.float32).T @ b.astype(np.float32)).astype(ml_dtypes.bfloat16)
    np.testing.assert_array_equal(out, ref)


def test_is_transpose_is_bit_exact_on_v3(rng):
    a = randn(rng, 6, 4)
    a[1, 2], a[3, 0] = np.nan, np.inf

    def body(x, eye):
        t = ps((4, 6))
        nisa.nc_matmul(dst=t, stationary=x, moving=eye, is_transpose=True)
        return t
    np.testing.assert_array_equal(run(body, a, np.eye(6, dtype=np.float32)), a.T)
    with pytest.raises(simulate.ValidationError, match=r"needs an identity moving tile \[6, 6\]"):
        run(body, a, np.ones((6, 6), np.float32))
    # NeuronCore-v2: only a profiler label, an ordinary matmul (NaN/Inf spread)
    assert np.isnan(run(body, a, np.eye(6, dtype=np.float32), target="trn1")[2]).all()


def test_double_row_fp8(rng):
    a = randn(rng, 128, 2, 3).astype(F8)
    b = randn(rng, 128, 2, 5).astype(F8)

    def body(x, y):
        acc = ps((3, 5))
        nisa.nc_matmul(dst=acc, stationary=x, moving=y, perf_mode=nisa.matmul_perf_mode.double_row)
        return acc
    ref = a.astype(np.float64).reshape(256, 3).T @ b.astype(np.float64).reshape(256, 5)
    np.testing.assert_allclose(run(body, a, b), ref, rtol=1e-5, atol=1e-4)
    assert events("nc_matmul")[0].flops == 2 * 256 * 3 * 5
    with pytest.raises(simulate.ValidationError, match="double_row needs NeuronCore-v3"):
        run(body, a, b, target="trn1")
    with pytest.raises(simulate.ValidationError, match="double_row needs fp8 inputs"):
        run(body, a.astype(ml_dtypes.bfloat16), b.astype(ml_dtypes.bfloat16))
    with pytest.raises(simulate.ValidationError, match=r"laid out \[K, 2, free\]"):
        run(body, a.reshape(128, 6), b.reshape(128, 10))


def test_tiling_mode(rng):
    a, b = randn(rng, 64, 32), randn(rng, 64, 8)
    ok = matmul_body(tile_position=(64, 0), tile_size=(64, 128))
    np.testing.assert_allclose(run(ok, a, b), a.T @ b, rtol=1e-5, atol=1e-5)
    cases = [
        (dict(tile_position=(0, 0)), "must be set together"),
        (dict(tile_position=(32, 0), tile_size=(64, 128)), "row tile start 32 must be a multiple"),
        (dict(tile_position=(0, 0), tile_size=(32, 128)), "K=64 exceeds the row tile size 32"),
        (dict(tile_position=(0, 0), tile_size=(64, 16)), "column tile size 16 must be one of"),
    ]
    for kw, match in cases:
        with pytest.raises(simulate.ValidationError, match=match):
            run(matmul_body(**kw), a, b)
    with pytest.raises(simulate.ValidationError, match=r"row tile size 32 must be one of \(128, 64\)"):
        run(matmul_body(tile_position=(0, 0), tile_size=(32, 128)), a[:32], b[:32], target="trn1")


def test_onezero_hint_is_checked():
    ones, b = np.ones((4, 3), np.float32), np.full((4, 5), 2.0, np.float32)
    np.testing.assert_array_equal(run(matmul_body(is_stationary_onezero=True), ones, b),
                                  np.full((3, 5), 8.0))
    with pytest.raises(simulate.ValidationError, match="is_moving_onezero=True but moving holds"):
        run(matmul_body(is_moving_onezero=True), ones, b)


@pytest.mark.parametrize("shape", [(1, 1), (100, 37), (128, 128), (7, 3, 5)])
def test_transpose_tensor_engine(rng, target, shape):
    a = randn(rng, *shape)
    P, F = shape[0], int(np.prod(shape[1:]))

    def body(x):
        t = ps((F, P))
        nisa.nc_transpose(dst=t, data=x)
        return t
    np.testing.assert_array_equal(run(body, a, target=target), a.reshape(P, F).T)
    (e,) = events("nc_transpose")
    assert (e.engine, e.partitions, e.free_elems) == ("tensor", P, F)


def test_transpose_vector_engine_and_limits(rng):
    a = randn(rng, 31, 17).astype(ml_dtypes.bfloat16)

    def vec(x):
        t = sb((17, 31), nl.bfloat16)
        nisa.nc_transpose(dst=t, data=x, engine=nisa.engine.vector)
        return t
    np.testing.assert_array_equal(run(vec, a), a.T)
    assert events("nc_transpose")[0].engine == "vector"
    with pytest.raises(simulate.ValidationError, match="vector engine transpose limit 32 x 32"):
        run(vec, np.zeros((33, 17), ml_dtypes.bfloat16))

    def wrong_dtype(x):
        nisa.nc_transpose(dst=ps((17, 31)), data=x)
        return x
    with pytest.raises(simulate.ValidationError, match="dst dtype float32 must equal data dtype"):
        run(wrong_dtype, a)

    def tensor_to_sbuf(x):
        nisa.nc_transpose(dst=sb((17, 31), nl.bfloat16), data=x, engine=nisa.engine.tensor)
        return x
    with pytest.raises(simulate.ValidationError, match=r"nc_transpose\(dst\).*accepts psum"):
        run(tensor_to_sbuf, a)
    with pytest.raises(simulate.ValidationError, match="engine=gpsimd is not one of"):
        run(lambda x: (nisa.nc_transpose(dst=ps((17, 31), nl.bfloat16), data=x,
                                         engine=nisa.engine.gpsimd), x)[1], a)


def test_transpose_nan_spreads_on_v2_only():
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    a[1, 2] = np.inf

    def body(x):
        t = ps((4, 3))
        nisa.nc_transpose(dst=t, data=x)
        return t
    np.testing.assert_array_equal(run(body, a, target="trn2"), a.T)
    v2 = run(body, a, target="trn1")
    assert v2[2, 1] == np.inf and np.isnan(v2[2, [0, 2]]).all()     # row 2 of a.T spoiled
    np.testing.assert_array_equal(np.delete(v2, 2, axis=0), np.delete(a.T, 2, axis=0))


def test_transpose_psum_dtype_by_generation(rng):
    """16-bit PE transpose mode exists from NeuronCore-v3; on v2 a TensorE transpose is an fp32
    matmul with the identity, so its PSUM dst must be fp32 (and may not be bf16)."""
    a = randn(rng, 64, 48).astype(ml_dtypes.bfloat16)

    def into(dtype):
        def body(x):
            t = ps((48, 64), dtype)
            nisa.nc_transpose(dst=t, data=x, engine=nisa.engine.tensor)
            return t
        return body
    np.testing.assert_array_equal(run(into(nl.bfloat16), a, target="trn2"), a.T)
    np.testing.assert_array_equal(run(into(nl.float32), a, target="trn1"), a.T.astype(np.float32))
    with pytest.raises(simulate.ValidationError, match="NeuronCore-v2 writes fp32 PSUM"):
        run(into(nl.bfloat16), a, target="trn1")
    with pytest.raises(simulate.ValidationError, match="must equal data dtype"):
        run(into(nl.float32), a, target="trn2")

    def matmul_transpose(dtype):
        def body(x, eye):
            t = ps((48, 64), dtype)
            nisa.nc_matmul(dst=t, stationary=x, moving=eye, is_transpose=True)
            return t
        return body
    eye = np.eye(64, dtype=ml_dtypes.bfloat16)
    np.testing.assert_array_equal(run(matmul_transpose(nl.bfloat16), a, eye, target="trn2"), a.T)
    with pytest.raises(simulate.ValidationError, match="dst dtype bfloat16 must be float32 on trn1"):
        run(matmul_transpose(nl.bfloat16), a, eye, target="trn1")


def test_accumulation_groups_are_tracked_per_element_of_a_view(rng):
    """Column slices of one PSUM tile (the decode kernel's per-head P @ V): a slice no matmul
    has written is fresh for auto and undefined for accumulate=True, even when another slice
    of the same tile is mid-group."""
    a, b = randn(rng, 8, 3), randn(rng, 8, 4)

    def auto(x, y):
        acc = ps((3, 8))
        nisa.nc_matmul(dst=acc[:, 0:4], stationary=x, moving=y)
        nisa.nc_matmul(dst=acc[:, 4:8], stationary=x, moving=y)          # fresh: = p
        nisa.nc_matmul(dst=acc[:, 0:4], stationary=x, moving=y)          # adds: = 2p
        return acc

    out = run(auto, a, b)
    p = a.T @ b
    np.testing.assert_allclose(out, np.concatenate([2 * p, p], axis=1), rtol=1e-5, atol=1e-5)

    def true_on_fresh_slice(x, y):
        acc = ps((3, 8))
        nisa.nc_matmul(dst=acc[:, 0:4], stationary=x, moving=y, accumulate=False)
        nisa.nc_matmul(dst=acc[:, 4:8], stationary=x, moving=y, accumulate=True)
        return acc

    with pytest.raises(simulate.ValidationError, match="accumulate=True onto PSUM not last"):
        run(true_on_fresh_slice, a, b, target="trn2")


@pytest.mark.parametrize("target", ["trn1", "trn2", "trn3"])
def test_tile_size_moving_fmax_is_one_bank_on_every_generation(target):
    """AWS's NKI front-end (KLR kernelEnv) gives gemm_moving_fmax 512 for arch 2, 3 and 4; the
    Trainium3 guide's largest moving tile is [128, 512]."""
    from nki_kernels import simulate
    from nki_kernels.simulate import nl
    with simulate.use_target(target):
        assert nl.tile_size.gemm_moving_fmax == 512


def test_matmul_moving_limit_is_wider_on_neuroncore_v4():
    """nc_matmul on NeuronCore-v4 takes N up to 4096 for an fp32 dst (eight PSUM banks); v3: 512."""
    from nki_kernels import simulate
    from nki_kernels.simulate import jit, nisa, nl

    @jit
    def mm(a, b):
        a_sb = nl.ndarray(a.shape, a.dtype, buffer=nl.sbuf)
        b_sb = nl.ndarray(b.shape, b.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=a_sb, src=a)
        nisa.dma_copy(dst=b_sb, src=b)
        out = nl.ndarray((a.shape[1], b.shape[1]), nl.float32, buffer=nl.psum)
        nisa.nc_matmul(dst=out, stationary=a_sb, moving=b_sb)
        res = nl.ndarray(out.shape, nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=res, src=out)
        o = nl.ndarray(out.shape, nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=o, src=res)
        return o

    a, b = np.ones((4, 2), np.float32), np.ones((4, 4096), np.float32)
    assert (simulate.simulate(mm, target="trn3")(a, b) == 4).all()
    with pytest.raises(simulate.ValidationError, match="moving free size N=4096 exceeds 512"):
        simulate.simulate(mm, target="trn2")(a, b)
