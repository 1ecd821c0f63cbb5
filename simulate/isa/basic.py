"""Fill and copy instructions: ``memset``, ``iota``, ``tensor_copy``."""

from __future__ import annotations

import numpy as np

from .. import dtypes
from .core import as_2d, engine_name, fail, free_elems, on_chip, record, same_partitions


def memset(dst, value, engine=None, name=None):
    """Fill ``dst`` with the compile-time constant ``value`` (int for integer tensors)."""
    op = "memset"
    d = on_chip(dst, op, "dst")
    eng = engine_name(engine, "vector", ("vector", "gpsimd"), op)
    if dtypes.is_int(dst.dtype) and not float(value).is_integer():
        fail(f"value {value!r} is not an integer, dst is {dst.dtype.name}", op, "value")
    d.write(dtypes.cast(np.full(dst.shape, value, dtype=np.float64 if dtypes.is_int(dst.dtype)
                                else np.float32), dst.dtype))
    return record(op, eng, {"dst": d}, name=name, partitions=dst.shape[0], free_elems=free_elems(d))


def iota(dst, pattern, offset=0, channel_multiplier=0, name=None):
    """``dst[p, i...] = offset + p * channel_multiplier + sum(i_k * step_k)`` (int32 math)."""
    op = "iota"
    d = on_chip(dst, op, "dst", buffers=("sbuf",))
    pattern = [tuple(p) for p in pattern]
    nums = [n for _, n in pattern]
    if int(np.prod(nums)) != free_elems(d):
        fail(f"pattern {pattern} makes {int(np.prod(nums))} elements per partition, dst has "
             f"{free_elems(d)}", op, "pattern")
    values = np.full([dst.shape[0]] + nums, int(offset), dtype=np.int64)
    values += (np.arange(dst.shape[0], dtype=np.int64) * int(channel_multiplier)).reshape(
        [-1] + [1] * len(nums))
    for k, (step, num) in enumerate(pattern):
        shape = [1] * (len(nums) + 1)
        shape[k + 1] = num
        values += (np.arange(num, dtype=np.int64) * int(step)).reshape(shape)
    values = values.astype(np.int32)
    d.write(dtypes.cast(values, dst.dtype).reshape(dst.shape))
    return record(op, "gpsimd", {"dst": d}, name=name, partitions=dst.shape[0],
                  free_elems=free_elems(d))


def tensor_copy(dst, src, engine=None, name=None):
    """Copy on a compute engine; bit-exact for equal dtypes, else converted through fp32."""
    op = "tensor_copy"
    d, s = on_chip(dst, op, "dst"), on_chip(src, op, "src")
    same_partitions(op, dst=d, src=s)
    if free_elems(d) != free_elems(s):
        fail(f"elements per partition differ: dst {free_elems(d)}, src {free_elems(s)}", op)
    eng = engine_name(engine, "vector", ("vector", "scalar", "gpsimd"), op)
    if eng == "gpsimd" and "psum" in (d.buffer, s.buffer):
        fail("GpSimd cannot access PSUM", op, "engine")
    values = as_2d(s.read())
    if dst.dtype != src.dtype:
        values = dtypes.cast(values, dst.dtype)
    d.write(values.reshape(dst.shape))
    return record(op, eng, {"dst": d, "src": s}, name=name, partitions=dst.shape[0],
                  free_elems=free_elems(d))
