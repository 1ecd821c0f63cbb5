"""Microscaling (OCP MX) instructions of NeuronCore-v4: ``quantize_mx`` (VectorE) and
``nc_matmul_mx`` (TensorE).

Layout (NKI ISA reference and the Trainium3 architecture guide): a scaling group is 32 values,
8 partitions x 4 consecutive free elements. The 4 values of a group in one partition are one
packed x4 element (code i of the element is free element 4j + i). Scale of group (g, j) (g: the
group's 8-partition block, j: the x4 column) sits in the SBUF quadrant the group comes from, at
partition ``32 * (g // 4) + g % 4`` of the scale view and column j (a [P // 8, F // 4] tile
when P <= 32). Scales are float8_e8m0fnu (or uint8) exponents: value 2^(code - 127).

quantize_mx: X = 2^(floor(log2(amax)) - (Emax - 1)), Emax 8 for e4m3fn and 15 for e5m2 (twice
the OCP sample scale: no saturation when rounding the group maximum); an all-zero group has
X = 2^-127. Codes are the values / X rounded to the element type (nearest even).

nc_matmul_mx: ``dst[M, N] (+)= sum over k, i of stat[k, m, i] * mov[k, n, i]``, each value
dequantised with its group's scale, products accumulated in fp32 (as ``nc_matmul``).
"""

from __future__ import annotations

import numpy as np

from .. import context, dtypes
from .core import as_2d, fail, free_elems, on_chip, record
from .matmul import _accumulate, _check_tiling

EMAX = {dtypes.float8_e4m3fn_x4: 8, dtypes.float8_e5m2_x4: 15}
SCALE_DTYPES = (dtypes.float8_e8m0fnu, dtypes.uint8)
GROUP_ROWS, QUADRANT = 8, 32


def _need_v4(op):
    target = context.current().target
    if target.nc_version < 4:
        fail(f"{op} needs NeuronCore-v4+ ({target.name} is v{target.nc_version})", op)
    return target


def scale_rows(parts: int) -> np.ndarray:
    """Partition (within the scale view) of each 8-partition group of a ``parts``-row tile."""
    g = np.arange(parts // GROUP_ROWS)
    return QUADRANT * (g // 4) + g % 4


def _check_scale(op, role, r, parts, cols):
    if r.tensor.dtype not in SCALE_DTYPES:
        fail(f"{role} dtype {r.tensor.dtype.name} must be float8_e8m0fnu or uint8", op, role)
    need = int(scale_rows(parts)[-1]) + 1
    if r.shape[0] < need or free_elems(r) != cols:
        fail(f"{role} {tuple(r.shape)} must have >= {need} partitions (scales of the 8-partition "
             f"groups sit in their own 32-partition quadrant) and {cols} columns", op, role)


def _unpack(values: np.ndarray, dtype) -> np.ndarray:
    """[P, C] packed x4 elements -> [P, C, 4] float32 values."""
    raw = values[dtype.names[0]]                                  # [P, C, 4] or [P, C, 2] bytes
    if dtype == dtypes.float4_e2m1fn_x4:
        raw = np.stack([raw & 0xF, raw >> 4], axis=-1).reshape(raw.shape[:-1] + (4,))
    return raw.astype(np.uint8).view(dtypes.PACKED_X4[dtype]).astype(np.float32)


def _pack(codes: np.ndarray, dtype) -> np.ndarray:
    """[P, C, 4] values of the element type -> [P, C] packed x4 elements."""
    out = np.zeros(codes.shape[:2], dtype)
    out[dtype.names[0]] = codes.view(np.uint8)
    return out


def _scale_values(r, parts, cols) -> np.ndarray:
    """[parts // 8, cols] float32 scales read from the scale view."""
    codes = np.ascontiguousarray(as_2d(r.read())[scale_rows(parts)]).view(np.uint8)
    return np.exp2(codes.astype(np.float32) - 127.0)


def quantize_mx(dst, src, dst_scale, name=None):
    """Quantise ``src`` [P, F] (fp16/bf16) into MX fp8 ``dst`` [P, F // 4] (x4) and its scales."""
    op = "quantize_mx"
    _need_v4(op)
    s = on_chip(src, op, "src", ("sbuf",))
    d = on_chip(dst, op, "dst", ("sbuf",))
    sc = on_chip(dst_scale, op, "dst_scale", ("sbuf",), mx_scale=True)
    if src.dtype not in (dtypes.float16, dtypes.bfloat16):
        fail(f"src dtype {src.dtype.name} must be float16 or bfloat16", op, "src")
    if dst.dtype not in EMAX:
        fail(f"dst dtype {dst.dtype.name} must be float8_e4m3fn_x4 or float8_e5m2_x4", op, "dst")
    P, F = s.shape[0], free_elems(s)
    if P % QUADRANT or P > 128 or F % 4:
        fail(f"src {tuple(s.shape)}: partitions must be a multiple of 32 (<= 128) and the free "
             f"size a multiple of 4", op, "src")
    if d.shape[0] != P or free_elems(d) != F // 4:
        fail(f"dst {tuple(d.shape)} must be [{P}, {F // 4}] (x4 elements)", op, "dst")
    _check_scale(op, "dst_scale", sc, P, F // 4)
    values = as_2d(s.read()).astype(np.float32).reshape(P // GROUP_ROWS, GROUP_ROWS, F // 4, 4)
    amax = np.abs(values).max(axis=(1, 3))                               # [P // 8, F // 4]
    with np.errstate(divide="ignore"):
        exponent = np.where(amax > 0, np.floor(np.log2(np.where(amax > 0, amax, 1.0)))
                            - (EMAX[dst.dtype] - 1), -127.0)
    exponent = np.clip(exponent, -127, 127)
    scaled = values / np.exp2(exponent)[:, None, :, None]
    codes = scaled.reshape(P, F // 4, 4).astype(dtypes.PACKED_X4[dst.dtype])
    d.write(_pack(codes, dst.dtype).reshape(d.shape))
    scales = as_2d(sc.read()).copy()
    scales[scale_rows(P)] = (exponent + 127).astype(np.uint8).view(scales.dtype)
    sc.write(scales.reshape(sc.shape))
    return record(op, "vector", {"dst": d, "src": s, "dst_scale": sc}, name=name,
                  partitions=P, free_elems=F)


def nc_matmul_mx(dst, stationary, moving, stationary_scale, moving_scale, tile_position=None,
                 tile_size=None, accumulate=None, name=None):
    """``dst[M, N] (+)= dequant(stationary)[K*4, M].T @ dequant(moving)[K*4, N]`` (MX inputs)."""
    op = "nc_matmul_mx"
    target = _need_v4(op)
    s = on_chip(stationary, op, "stationary", ("sbuf",))
    m = on_chip(moving, op, "moving", ("sbuf",))
    ss = on_chip(stationary_scale, op, "stationary_scale", ("sbuf",), mx_scale=True)
    ms = on_chip(moving_scale, op, "moving_scale", ("sbuf",), mx_scale=True)
    d = on_chip(dst, op, "dst", ("psum",))
    for role, t in (("stationary", stationary), ("moving", moving)):
        if t.dtype not in dtypes.PACKED_X4:
            fail(f"{role} dtype {t.dtype.name} must be float8_e5m2_x4, float8_e4m3fn_x4 or "
                 f"float4_e2m1fn_x4", op, role)
    if dst.dtype not in (dtypes.float32, dtypes.bfloat16):
        fail(f"dst dtype {dst.dtype.name} must be float32 or bfloat16", op, "dst")
    K, M, N = s.shape[0], free_elems(s), free_elems(m)
    if m.shape[0] != K or K % QUADRANT or K > 128:
        fail(f"stationary and moving partitions ({K}, {m.shape[0]}) must be equal, a multiple of "
             f"32 and <= 128", op, "moving")
    if M % 2 or M > 128:
        fail(f"stationary free size {M} must be even and <= 128", op, "stationary")
    n_max = 8192 if dst.dtype == dtypes.bfloat16 else 4096
    if N > n_max:
        fail(f"moving free size {N} exceeds {n_max} for a {dst.dtype.name} dst", op, "moving")
    if d.shape[0] != M or free_elems(d) != N:
        fail(f"dst {tuple(d.shape)} must be [M={M}, N={N}]", op, "dst")
    if tile_size is not None and tuple(tile_size)[1:] != (128,):
        fail("nc_matmul_mx tiles rows only: tile_size must be (rows, 128)", op, "tile_size")
    if tile_position is not None and tuple(tile_position)[1:] != (0,):
        fail("nc_matmul_mx tiles rows only: tile_position must be (row, 0)", op, "tile_position")
    _check_tiling(op, tile_position or (), tile_size or (), K, M, False, target)
    _check_scale(op, "stationary_scale", ss, K, M)
    _check_scale(op, "moving_scale", ms, K, N)
    a = _unpack(as_2d(s.read()), stationary.dtype)                       # [K, M, 4]
    b = _unpack(as_2d(m.read()), moving.dtype)                           # [K, N, 4]
    a = a * np.repeat(_scale_values(ss, K, M), GROUP_ROWS, axis=0)[:, :, None]
    b = b * np.repeat(_scale_values(ms, K, N), GROUP_ROWS, axis=0)[:, :, None]
    with np.errstate(all="ignore"):
        product = np.einsum("kmi,kni->mn", a, b, dtype=np.float32)
    _accumulate(op, d, product, accumulate, target)
    return record(op, "tensor", {"dst": d, "stationary": s, "moving": m,
                                 "stationary_scale": ss, "moving_scale": ms}, name=name,
                  partitions=K, free_elems=N, flops=2 * 4 * K * M * N, details={"M": M})

