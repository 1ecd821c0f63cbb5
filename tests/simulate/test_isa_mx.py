"""MX (microscaling) quantize and matmul on NeuronCore-v4, against a NumPy model written from the
ISA reference: 32-value groups of 8 partitions x 4 free elements, scales in the group's quadrant."""

import ml_dtypes
import numpy as np
import pytest

from nki_kernels import simulate
from nki_kernels.simulate import nisa, nl

from .isa_util import run, sb

E8M0 = ml_dtypes.float8_e8m0fnu
ELEM = {"float8_e4m3fn_x4": (ml_dtypes.float8_e4m3fn, 8),
        "float8_e5m2_x4": (ml_dtypes.float8_e5m2, 15)}


def quantize_ref(x, kind):
    """(codes [P, F] of the element type, scale exponents [P // 8, F // 4]) of ``x`` [P, F]."""
    elem, emax = ELEM[kind]
    P, F = x.shape
    codes = np.empty((P, F), elem)
    exps = np.empty((P // 8, F // 4), np.int64)
    for g in range(P // 8):
        for j in range(F // 4):
            block = x[8 * g:8 * g + 8, 4 * j:4 * j + 4].astype(np.float64)
            amax = np.abs(block).max()
            e = int(np.floor(np.log2(amax))) - (emax - 1) if amax > 0 else -127
            exps[g, j] = e
            codes[8 * g:8 * g + 8, 4 * j:4 * j + 4] = (block / 2.0 ** e).astype(np.float32).astype(elem)
    return codes, exps


def scale_partitions(P):
    return [32 * (g // 4) + g % 4 for g in range(P // 8)]


@pytest.mark.parametrize("kind", list(ELEM))
@pytest.mark.parametrize("P", [32, 64, 128])
def test_quantize_mx_matches_the_documented_scale_rule(rng, kind, P):
    F = 16
    x = (rng.standard_normal((P, F)) * np.exp2(rng.integers(-6, 6, (P, 1)))).astype(ml_dtypes.bfloat16)
    x[:8, :4] = 0                                               # an all-zero group: 2^-127

    def body(src):
        dst = sb((P, F // 4), getattr(nl, kind), "q")
        scale = sb((P if P > 32 else P // 8, F // 4), nl.float8_e8m0fnu, "scale")
        nisa.memset(dst=scale, value=1.0)                       # code 127 everywhere
        nisa.quantize_mx(dst=dst, src=src, dst_scale=scale)
        return dst, scale
    q, scale = run(body, x, target="trn3")
    codes, exps = quantize_ref(x, kind)
    got_codes = q[kind].reshape(P, F)
    np.testing.assert_array_equal(got_codes, codes.view(np.uint8))
    rows = scale_partitions(P)
    np.testing.assert_array_equal(scale[rows].view(np.uint8), (exps + 127).astype(np.uint8))
    assert exps[0, 0] == -127
    unused = np.setdiff1d(np.arange(scale.shape[0]), rows)
    assert (scale[unused].view(np.uint8) == 127).all()          # only the group rows are written


@pytest.mark.parametrize("kinds", [("float8_e4m3fn_x4", "float8_e4m3fn_x4"),
                                   ("float8_e5m2_x4", "float8_e4m3fn_x4")])
def test_quantize_then_matmul_mx_equals_the_dequantised_product(rng, kinds):
    K, M, N = 64, 16, 24                                       # K x4 = 256 contraction values
    xs = rng.standard_normal((K, 4 * M)).astype(ml_dtypes.bfloat16)
    ys = rng.standard_normal((K, 4 * N)).astype(ml_dtypes.bfloat16)

    def body(x, y):
        out = []
        for t, kind, free in ((x, kinds[0], M), (y, kinds[1], N)):
            q = sb((K, free), getattr(nl, kind), "q")
            s = sb((K, free), nl.float8_e8m0fnu, "s")
            nisa.memset(dst=s, value=0)
            nisa.quantize_mx(dst=q, src=t, dst_scale=s)
            out += [q, s]
        acc = nl.ndarray((M, N), nl.float32, buffer=nl.psum, name="acc")
        nisa.nc_matmul_mx(dst=acc, stationary=out[0], moving=out[2], stationary_scale=out[1],
                          moving_scale=out[3])
        return acc
    got = run(body, xs, ys, target="trn3")
    deq = []
    for t, kind in ((xs, kinds[0]), (ys, kinds[1])):
        codes, exps = quantize_ref(t, kind)
        deq.append(codes.astype(np.float64) * np.repeat(np.repeat(2.0 ** exps, 8, 0), 4, 1))
    # value (k, 4c + i) of a tile is element i of x4 column c; the contraction runs over k and i
    a = deq[0].reshape(K, M, 4)
    b = deq[1].reshape(K, N, 4)
    want = np.einsum("kmi,kni->mn", a, b)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    exact = xs.astype(np.float64).reshape(K, M, 4)
    full = np.einsum("kmi,kni->mn", exact, ys.astype(np.float64).reshape(K, N, 4))
    assert np.abs(got - full).max() < 0.1 * np.abs(full).max()  # MX error is quantisation-sized


@pytest.mark.parametrize("platform, scale_rows, match", [
    ("trn2", 4, "needs NeuronCore-v4"), ("trn3", 3, ">= 4 partitions")])
def test_mx_is_v4_only_and_checks_layout(rng, platform, scale_rows, match):
    x = rng.standard_normal((32, 8)).astype(ml_dtypes.bfloat16)

    def body(src):
        q = sb((32, 2), nl.float8_e4m3fn_x4, "q")
        s = sb((scale_rows, 2), nl.float8_e8m0fnu, "s")
        nisa.quantize_mx(dst=q, src=src, dst_scale=s)
        return q
    with pytest.raises(simulate.ValidationError, match=match):
        run(body, x, target=platform)


def test_matmul_mx_reads_fp4_nibbles_low_first_and_applies_scales(rng):
    from nki_kernels.simulate import dtypes
    K, M, N = 32, 2, 3
    fp4 = rng.choice([0.5, 1.0, 1.5, 2.0, 3.0, -4.0, 6.0, -0.5], size=(K, N, 4))
    codes = fp4.astype(ml_dtypes.float4_e2m1fn).view(np.uint8) & 0xF
    moving = np.zeros((K, N), dtypes.float4_e2m1fn_x4)
    moving["float4_e2m1fn_x4"] = codes[..., 0::2] | (codes[..., 1::2] << 4)   # low nibble first
    stat = np.zeros((K, M), dtypes.float8_e4m3fn_x4)
    stat["float8_e4m3fn_x4"] = np.full((K, M, 4), 1.0, ml_dtypes.float8_e4m3fn).view(np.uint8)
    s_scale = np.full((K // 8, M), 127, np.uint8)                   # 2^0
    m_scale = np.full((K // 8, N), 127, np.uint8)
    m_scale[1] = 128                                                # group 1 (rows 8..15): x2

    def body(st, mv, ss, ms):
        acc = nl.ndarray((M, N), nl.float32, buffer=nl.psum, name="acc")
        nisa.nc_matmul_mx(dst=acc, stationary=st, moving=mv, stationary_scale=ss,
                          moving_scale=ms)
        return acc
    got = run(body, stat, moving, s_scale, m_scale, target="trn3")
    weight = np.ones(K)
    weight[8:16] = 2.0
    want = np.einsum("k,kni->n", weight, fp4)
    np.testing.assert_allclose(got, np.broadcast_to(want, (M, N)), rtol=1e-6)


@pytest.mark.parametrize("offset", [4, 8, 12])
def test_scales_packed_at_a_quadrant_offset(rng, offset):
    """Quantize-MX and Matmul-MX read and write scales at offset 0, 4, 8 or 12 of each quadrant
    (the SDK's mxfp-matmul deep dive, "Packing Scale Values"): two tensors' scales share one
    tile, and the product equals the one with scales of their own; other offsets are refused."""
    K, M, N = 128, 16, 24
    xs = rng.standard_normal((K, 4 * M)).astype(ml_dtypes.bfloat16)
    ys = rng.standard_normal((K, 4 * N)).astype(ml_dtypes.bfloat16)

    def body(x, y, packed):
        qx = sb((K, M), nl.float8_e4m3fn_x4, "qx")
        qy = sb((K, N), nl.float8_e4m3fn_x4, "qy")
        if packed:
            shared = sb((K, N), nl.uint8, "scales")
            sx, sy = shared[0:, 0:M], shared[offset:, :]
        else:
            sx, sy = sb((K, M), nl.uint8, "sx"), sb((K, N), nl.uint8, "sy")
        nisa.quantize_mx(dst=qx, src=x, dst_scale=sx)
        nisa.quantize_mx(dst=qy, src=y, dst_scale=sy)
        acc = nl.ndarray((M, N), nl.float32, buffer=nl.psum, name="acc")
        nisa.nc_matmul_mx(dst=acc, stationary=qx, moving=qy, stationary_scale=sx,
                          moving_scale=sy)
        return acc
    packed = run(lambda x, y: body(x, y, True), xs, ys, target="trn3")
    alone = run(lambda x, y: body(x, y, False), xs, ys, target="trn3")
    np.testing.assert_array_equal(packed, alone)

    def odd(src):
        q = sb((128, 2), nl.float8_e4m3fn_x4, "q")
        s = sb((128, 2), nl.uint8, "s")
        nisa.quantize_mx(dst=q, src=src, dst_scale=s[offset + 2:, :])
        return q
    with pytest.raises(simulate.ValidationError, match="starts at partition"):
        run(odd, rng.standard_normal((128, 8)).astype(ml_dtypes.bfloat16), target="trn3")
