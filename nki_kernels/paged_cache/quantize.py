"""fp8 quantize-on-write: wider K/V rows stored into an fp8 cache with per-tensor or per-head
scales, as the serving stacks configure it (NxD Inference, vLLM: stored = x / scale, clamped).

The kernel multiplies by the float32 reciprocal of each head's scale (``x * (1 / scale)``, one
rounding apart from ``x / scale``), clamps to the cache dtype's largest finite value (fp8 e4m3fn
has no infinity: an unclamped overflow would be NaN) and rounds to nearest even. Attention reads
the cache back with the same ``k_scale`` / ``v_scale``.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

FP8_DTYPES = ("float8_e4m3fn", "float8_e5m2", "float8_e4m3")
WIDE_DTYPES = ("float32", "float16", "bfloat16")


FP32_TINY = float(np.finfo(np.float32).tiny)      # smallest normal float32
FP32_MAX = float(np.finfo(np.float32).max)


def check_scale(name: str, scale, num_heads: int):
    """A positive number that is a normal float32 (in [1.18e-38, 3.4e38]: the kernels take it,
    and its reciprocal, in float32), or a float array [num_heads] of them (per kv head):
    returned as float32 [num_heads]."""
    if isinstance(scale, np.ndarray):
        if scale.shape != (num_heads,) or scale.dtype.kind != "f":
            raise ValueError(f"{name} array must be float with shape (num_kv_heads,) = "
                             f"({num_heads},), got {scale.dtype} {scale.shape}")
        values = scale.astype(np.float64)
    elif isinstance(scale, (bool, np.bool_)) or not isinstance(scale, (int, float, np.integer,
                                                                         np.floating)):
        raise TypeError(f"{name}={scale!r} must be a real number or a float array [num_kv_heads]")
    else:
        values = np.full(num_heads, float(scale))
    ok = np.isfinite(values) & (values >= FP32_TINY) & (values <= FP32_MAX)
    if not ok.all():
        bad = float(values[~ok][0])
        raise ValueError(f"{name}={bad} must be a positive finite number and a normal float32 "
                         f"(in [{FP32_TINY:.3g}, {FP32_MAX:.3g}]: the kernel uses it and its "
                         f"float32 reciprocal)")
    return values.astype(np.float32)


def quant_table(k_scale, v_scale, cache_dtype, row_dtypes, num_heads, head_dim):
    """(quant [2, H*D] float32 reciprocals of K's / V's scale per element, limit) for the kernel,
    or (None, 0.0) when rows are written as they are (their dtype equals the cache's).
    ``row_dtypes``: {argument name: dtype} of the rows to write, each checked."""
    quantize = k_scale is not None or v_scale is not None
    if not quantize:
        return None, 0.0
    if np.dtype(cache_dtype).name not in FP8_DTYPES:
        raise TypeError(f"k_scale / v_scale quantize on write into an fp8 cache {FP8_DTYPES}; "
                        f"this cache is {np.dtype(cache_dtype).name}")
    for name, row_dtype in row_dtypes.items():
        if np.dtype(row_dtype).name not in WIDE_DTYPES:
            raise TypeError(f"{name} rows to quantize must be one of {WIDE_DTYPES}, got "
                            f"{np.dtype(row_dtype)}")
    if k_scale is None or v_scale is None:
        raise ValueError("quantize on write needs both k_scale and v_scale")
    inverse = [np.float32(1.0) / check_scale(name, s, num_heads)
               for name, s in (("k_scale", k_scale), ("v_scale", v_scale))]
    quant = np.stack([np.repeat(inv, head_dim) for inv in inverse]).astype(np.float32)
    return quant, float(ml_dtypes.finfo(cache_dtype).max)


def quantize_ref(rows, scale, cache_dtype):
    """The reference: rows [T, H, D] -> cache dtype, ``rows * float32(1 / scale[h])`` clamped."""
    inv = np.float32(1.0) / check_scale("scale", scale, rows.shape[1])
    limit = np.float32(ml_dtypes.finfo(cache_dtype).max)
    scaled = rows.astype(np.float32) * inv[None, :, None]
    return np.clip(scaled, -limit, limit).astype(cache_dtype)
