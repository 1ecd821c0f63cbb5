"""Selection and cross-partition instructions: ``affine_select``, ``range_select``,
``tensor_partition_reduce``."""

from __future__ import annotations

import numpy as np

from .. import context, dtypes
from ..errors import TargetError
from .core import as_2d, fail, free_elems, on_chip, record, same_partitions
from .elementwise import check_op, scalar_operand

FP32_MIN = -3.4028235e38


def affine_select(dst, pattern, channel_multiplier, on_true_tile, on_false_value,
                  cmp_op=None, offset=0, name=None):
    """GpSimd: ``v = offset + p * channel_multiplier + sum(i_k * step_k)``; keep ``on_true_tile``
    where ``cmp_op(v, 0)`` (default ``nl.equal``), else ``on_false_value``."""
    from ..ops import ALU_OPS
    op_name = "affine_select"
    cmp_op = ALU_OPS["equal"] if cmp_op is None else check_op(op_name, cmp_op, "cmp_op",
                                                              ("compare",))
    d = on_chip(dst, op_name, "dst", ("sbuf",))
    t = on_chip(on_true_tile, op_name, "on_true_tile", ("sbuf",))
    parts = same_partitions(op_name, dst=d, on_true_tile=t)
    nums = [int(n) for _, n in pattern]
    if int(np.prod(nums)) != free_elems(d) or free_elems(t) != free_elems(d):
        fail(f"pattern {list(pattern)} makes {int(np.prod(nums))} elements per partition, dst has "
             f"{free_elems(d)}, on_true_tile {free_elems(t)}", op_name, "pattern")
    value = np.full([parts] + nums, int(offset), dtype=np.int64)
    value += (np.arange(parts) * int(channel_multiplier)).reshape([-1] + [1] * len(nums))
    for k, (step, num) in enumerate(pattern):
        shape = [1] * (len(nums) + 1)
        shape[k + 1] = num
        value += (np.arange(num) * int(step)).reshape(shape)
    keep = cmp_op.fn(value.reshape(parts, -1).astype(np.float64), np.zeros(1)) != 0
    out = np.where(keep, as_2d(t.read()).astype(np.float32), np.float32(on_false_value))
    d.write(dtypes.cast(out, dst.dtype).reshape(dst.shape))
    return record(op_name, "gpsimd", {"dst": d, "on_true_tile": t}, name=name, partitions=parts,
                  free_elems=free_elems(d))


def range_select(dst, on_true_tile, comp_op0, comp_op1, bound0, bound1, reduce_cmd=None,
                 reduce_res=None, reduce_op=None, range_start=0, on_false_value=FP32_MIN, name=None):
    """VectorE (v3+): keep element ``j`` if ``(j + range_start) comp_op0 bound0`` and ``... comp_op1
    bound1`` (bounds: numbers or [P, 1] tiles), else ``on_false_value`` (must be FP32_MIN); optional
    row max into ``reduce_res``."""
    op_name = "range_select"
    if context.current().target.nc_version < 3:
        context.fail(TargetError, "range_select needs NeuronCore-v3+", op=op_name, operand=None)
    if np.float32(on_false_value) != np.float32(FP32_MIN):
        fail(f"on_false_value must be {FP32_MIN}", op_name, "on_false_value")
    check_op(op_name, comp_op0, "comp_op0", ("compare",))
    check_op(op_name, comp_op1, "comp_op1", ("compare",))
    d, t = on_chip(dst, op_name, "dst"), on_chip(on_true_tile, op_name, "on_true_tile")
    parts = same_partitions(op_name, dst=d, on_true_tile=t)
    b0, _ = scalar_operand(op_name, bound0, "bound0", parts)
    b1, _ = scalar_operand(op_name, bound1, "bound1", parts)
    idx = (np.arange(free_elems(t)) + int(range_start)).astype(np.float32)[None, :]
    keep = (comp_op0.fn(idx, b0.astype(np.float32)) != 0) & (comp_op1.fn(idx, b1.astype(np.float32)) != 0)
    out = np.where(keep, as_2d(t.read()).astype(np.float32), np.float32(FP32_MIN))
    d.write(dtypes.cast(out, dst.dtype).reshape(dst.shape))
    operands = {"dst": d, "on_true_tile": t}
    if reduce_res is not None:
        rr = on_chip(reduce_res, op_name, "reduce_res")
        rr.write(dtypes.cast(out.max(axis=1, keepdims=True), reduce_res.dtype).reshape(rr.shape))
        operands["reduce_res"] = rr
    return record(op_name, "vector", operands, name=name, partitions=parts, free_elems=free_elems(d))


def tensor_partition_reduce(dst, op, data, name=None):
    """GpSimd: reduce across partitions: ``dst[0, :] = op over p of data[p, :]``."""
    op_name = "tensor_partition_reduce"
    token = check_op(op_name, op, "op")
    if token.name not in ("add", "maximum", "minimum", "bitwise_or", "bitwise_and"):
        fail(f"{token!r} is not a partition reduction (add, maximum, bitwise_or/and)", op_name, "op")
    d, x = on_chip(dst, op_name, "dst", ("sbuf",)), on_chip(data, op_name, "data", ("sbuf",))
    values = as_2d(x.read())
    values = values.astype(np.int64 if dtypes.is_int(data.dtype) else np.float32)
    ufunc = {"add": np.add, "maximum": np.maximum, "minimum": np.minimum,
             "bitwise_or": np.bitwise_or, "bitwise_and": np.bitwise_and}[token.name]
    out = ufunc.reduce(values, axis=0, keepdims=True)
    if dst.shape[0] != 1 or free_elems(d) != values.shape[1]:
        fail(f"dst {dst.shape} must be [1, {values.shape[1]}]", op_name, "dst")
    d.write(dtypes.cast(out, dst.dtype).reshape(dst.shape))
    return record(op_name, "gpsimd", {"dst": d, "data": x}, name=name,
                  partitions=values.shape[0], free_elems=values.shape[1])
