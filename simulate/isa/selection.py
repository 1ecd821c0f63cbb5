"""Selections: ``affine_select`` (GpSimd), ``range_select`` (VectorE, v3+), ``select_reduce``
(VectorE). There is no ``nisa.select``: ``tensor_copy_predicated`` is the other predicated copy."""

from __future__ import annotations

import numpy as np

from .. import context, dtypes
from ..errors import TargetError
from ..ops import ALU_OPS
from . import accumulators
from .core import as_2d, fail, free_elems, on_chip, record, same_partitions
from .elementwise import check_op, not_both_psum, same_free, scalar_operand, store
from .enums import reduce_cmd as cmd_enum

FP32_MIN = -3.4028235e38


def affine_values(pattern, parts, offset, channel_multiplier) -> np.ndarray:
    """``offset + p * channel_multiplier + sum(i_k * step_k)`` as int64 [P, prod(nums)]."""
    nums = [int(n) for _, n in pattern]
    value = np.full([parts] + nums, int(offset), dtype=np.int64)
    value += (np.arange(parts) * int(channel_multiplier)).reshape([-1] + [1] * len(nums))
    for k, (step, num) in enumerate(pattern):
        shape = [1] * (len(nums) + 1)
        shape[k + 1] = int(num)
        value += (np.arange(int(num)) * int(step)).reshape(shape)
    return value.reshape(parts, -1)


def affine_select(dst, pattern, channel_multiplier, on_true_tile, on_false_value,
                  cmp_op=None, offset=0, name=None):
    """GpSimd (SBUF only): keep ``on_true_tile`` where ``cmp_op(affine value, 0)`` (default
    ``nl.equal``), else the fp32 number ``on_false_value``; the affine value is
    ``offset + p * channel_multiplier + sum(i_k * step_k)`` over a <= 4-D ``pattern``."""
    o = "affine_select"
    cmp_op = ALU_OPS["equal"] if cmp_op is None else check_op(o, cmp_op, "cmp_op", ("compare",))
    d = on_chip(dst, o, "dst", ("sbuf",))
    t = on_chip(on_true_tile, o, "on_true_tile", ("sbuf",))
    parts = same_partitions(o, dst=d, on_true_tile=t)
    n = same_free(o, dst=d, on_true_tile=t)
    pattern = [tuple(p) for p in pattern]
    if not 1 <= len(pattern) <= 4:
        fail(f"pattern {pattern} must have 1 to 4 [step, num] pairs", o, "pattern")
    count = int(np.prod([num for _, num in pattern]))
    if count != n:
        fail(f"pattern {pattern} makes {count} elements per partition, dst has {n}", o, "pattern")
    if not isinstance(on_false_value, (int, float, np.floating, np.integer)):
        fail(f"on_false_value must be an fp32 number, got {type(on_false_value).__name__}", o,
             "on_false_value")
    value = affine_values(pattern, parts, offset, channel_multiplier)
    keep = cmp_op.fn(value.astype(np.float64), np.zeros(1)) != 0
    values = as_2d(t.read())
    if dst.dtype == on_true_tile.dtype:
        fill = dtypes.cast(np.full(values.shape, on_false_value, np.float32), dst.dtype)
        d.write(np.where(keep, values, fill).reshape(dst.shape))
    else:
        store(d, np.where(keep, values.astype(np.float32), np.float32(on_false_value)))
    return record(o, "gpsimd", {"dst": d, "on_true_tile": t}, name=name, partitions=parts,
                  free_elems=n)


RANGE_CMPS = ("equal", "less", "less_equal", "greater", "greater_equal")


def _store_with_row_max(o, d, out, reduce_cmd, reduce_res, operands, name):
    """Write the selected values, fold their row max into the VectorE registers per
    ``reduce_cmd``, read the registers into ``reduce_res`` if given, and record the event."""
    parts, n = out.shape
    store(d, out)
    regs = accumulators.update("vector", reduce_cmd, "maximum", out, read=reduce_res is not None)
    if reduce_res is not None:
        rr = on_chip(reduce_res, o, "reduce_res")
        if rr.shape[0] != parts or free_elems(rr) != 1:
            fail(f"reduce_res {reduce_res.shape} must be [{parts}, 1]", o, "reduce_res")
        if not dtypes.is_float(reduce_res.dtype):
            fail(f"reduce_res must be a float tile, got {reduce_res.dtype.name}", o, "reduce_res")
        store(rr, regs)
        operands["reduce_res"] = rr
    return record(o, "vector", operands, name=name, partitions=parts, free_elems=n,
                  details={"reduce": reduce_res is not None})


def _max_only(o, reduce_op):
    if reduce_op is not None and getattr(reduce_op, "name", None) != "maximum":
        fail(f"reduce_op={reduce_op!r}: only nl.maximum is supported", o, "reduce_op")


def range_select(dst, on_true_tile, comp_op0, comp_op1, bound0, bound1,
                 reduce_cmd=cmd_enum.reset_reduce, reduce_res=None, reduce_op=None, range_start=0,
                 on_false_value=FP32_MIN, name=None):
    """VectorE (v3+): keep element ``j`` where ``(j + range_start) comp_op0 bound0`` and
    ``... comp_op1 bound1`` (fp32 compare; bounds numbers or [P, 1] tiles), else FP32_MIN; the
    row max goes through the VectorE registers into ``reduce_res``."""
    o = "range_select"
    target = context.current().target
    if target.nc_version < 3:
        context.fail(TargetError, f"range_select needs NeuronCore-v3+ ({target.name} is v2)",
                     op=o, operand=None)
    if np.float32(on_false_value) != np.float32(FP32_MIN):
        fail(f"on_false_value must be FP32_MIN ({FP32_MIN})", o, "on_false_value")
    for role, tok in (("comp_op0", comp_op0), ("comp_op1", comp_op1)):
        check_op(o, tok, role, ("compare",))
        if tok.name not in RANGE_CMPS:
            fail(f"{role}={tok!r} must be one of {', '.join('nl.' + c for c in RANGE_CMPS)}",
                 o, role)
    _max_only(o, reduce_op)
    d, t = on_chip(dst, o, "dst"), on_chip(on_true_tile, o, "on_true_tile")
    parts = same_partitions(o, dst=d, on_true_tile=t)
    n = same_free(o, dst=d, on_true_tile=t)
    if not dtypes.is_float(on_true_tile.dtype):
        fail(f"on_true_tile must be a float tile, got {on_true_tile.dtype.name}", o, "on_true_tile")
    operands = {"dst": d, "on_true_tile": t}
    bounds = []
    for role, bound in (("bound0", bound0), ("bound1", bound1)):
        arr, r = scalar_operand(o, bound, role, parts)
        if r is not None:
            operands[role] = r
        bounds.append(arr.astype(np.float32))
    idx = (np.arange(n, dtype=np.float64) + int(range_start)).astype(np.float32)[None, :]
    keep = (comp_op0.fn(idx, bounds[0]) != 0) & (comp_op1.fn(idx, bounds[1]) != 0)
    out = np.where(keep, as_2d(t.read()).astype(np.float32), np.float32(FP32_MIN))
    return _store_with_row_max(o, d, out, reduce_cmd, reduce_res, operands, name)


SELECT_PREDICATES = (dtypes.int8, dtypes.uint8, dtypes.int16, dtypes.uint16)


def select_reduce(dst, predicate, on_true, on_false, reduce_res=None, reduce_cmd=cmd_enum.idle,
                  reduce_op=None, reverse_pred=False, name=None):
    """VectorE: ``dst = where(predicate, on_true, on_false)`` (on_false a number or [P, 1] tile),
    optional row max through the VectorE registers into ``reduce_res``."""
    o = "select_reduce"
    _max_only(o, reduce_op)
    d, t, p = on_chip(dst, o, "dst"), on_chip(on_true, o, "on_true"), on_chip(predicate, o,
                                                                               "predicate")
    parts = same_partitions(o, dst=d, on_true=t, predicate=p)
    same_free(o, dst=d, on_true=t, predicate=p)
    not_both_psum(o, t, p, ("on_true", "predicate"))
    if predicate.dtype not in SELECT_PREDICATES:
        fail(f"predicate must be int8/uint8/int16/uint16, got {predicate.dtype.name}", o,
             "predicate")
    if on_true.dtype in (dtypes.int32, dtypes.uint32):
        fail(f"on_true cannot be {on_true.dtype.name}", o, "on_true")
    false_values, r = scalar_operand(o, on_false, "on_false", parts)
    operands = {"dst": d, "on_true": t, "predicate": p}
    if r is not None:
        operands["on_false"] = r
    keep = as_2d(p.read()) != 0
    if reverse_pred:
        keep = ~keep
    out = np.where(keep, as_2d(t.read()).astype(np.float32), false_values.astype(np.float32))
    return _store_with_row_max(o, d, out, reduce_cmd, reduce_res, operands, name)
