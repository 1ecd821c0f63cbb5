"""Reductions: ``tensor_reduce``, ``tensor_scalar_reduce`` (VectorE), ``tensor_partition_reduce``
(GpSimd), ``bn_stats``/``bn_aggr`` and ``max8`` (VectorE).

Arithmetic reductions are fp32 math; bitvec reductions work on 32-bit patterns of integer inputs.
"""

from __future__ import annotations

import numpy as np

from . import accumulators
from .core import as_2d, fail, free_elems, on_chip, record, same_partitions
from .elementwise import _bits, apply, check_op, need_ints, same_free, scalar_operand, store
from .enums import reduce_cmd as cmd_enum

_FREE = {
    "add": lambda v: np.add.reduce(v, axis=-1),
    "subtract": lambda v: v[..., 0] - v[..., 1:].sum(axis=-1),
    "multiply": lambda v: np.multiply.reduce(v, axis=-1),
    "maximum": lambda v: np.maximum.reduce(v, axis=-1),
    "minimum": lambda v: np.minimum.reduce(v, axis=-1),
    "logical_and": lambda v: np.all(v != 0, axis=-1).astype(np.float32),
    "logical_or": lambda v: np.any(v != 0, axis=-1).astype(np.float32),
    "logical_xor": lambda v: (np.sum(v != 0, axis=-1) % 2).astype(np.float32),
    "bitwise_and": lambda v: np.bitwise_and.reduce(v, axis=-1),
    "bitwise_or": lambda v: np.bitwise_or.reduce(v, axis=-1),
    "bitwise_xor": lambda v: np.bitwise_xor.reduce(v, axis=-1),
}


def reduce_axes(op_name, data, axis):
    """Normalise ``axis``; it must name the last contiguous free axes (never axis 0)."""
    axes = (axis,) if isinstance(axis, (int, np.integer)) else tuple(axis)
    if not axes:
        fail("axis is empty", op_name, "axis")
    axes = tuple(sorted(int(a) + data.ndim if a < 0 else int(a) for a in axes))
    trailing = tuple(range(data.ndim - len(axes), data.ndim))
    if 0 in axes or axes != trailing:
        fail(f"axis={axis} must be the last contiguous free axes of a {data.ndim}-D tile, "
             f"ending at axis {data.ndim - 1} (partition axis 0 is never reduced)", op_name, "axis")
    return axes


def tensor_reduce(dst, op, data, axis, negate=False, keepdims=False, name=None):
    """``dst = op-reduce of data over trailing free ``axis``; ``negate`` multiplies the result by
    -1 (arithmetic ops). dst holds the kept elements per partition (keepdims only shapes them)."""
    o = "tensor_reduce"
    token = check_op(o, op, "op")
    if not token.is_reduction:
        fail(f"{token!r} is not a legal reduction operator", o, "op")
    d, x = on_chip(dst, o, "dst"), on_chip(data, o, "data")
    parts = same_partitions(o, dst=d, data=x)
    axes = reduce_axes(o, data, axis)
    kept = int(np.prod(data.shape[1:axes[0]], dtype=np.int64))
    if free_elems(d) != kept:
        fail(f"dst holds {free_elems(d)} elements per partition, reducing axis {axes} of "
             f"{data.shape} leaves {kept}", o, "dst")
    bitvec = token.kind == "bitvec"
    values = x.read().reshape(parts, kept, -1)
    if bitvec:
        need_ints(o, token, dst=dst, data=data)
        if negate:
            fail("negate applies to arithmetic reductions only", o, "negate")
        out = _FREE[token.name](_bits(values))
    else:
        with np.errstate(all="ignore"):
            out = _FREE[token.name](values.astype(np.float32)).astype(np.float32)
        if negate:
            out = -out
    store(d, out, bitvec)
    return record(o, "vector", {"dst": d, "data": x}, name=name, partitions=parts,
                  free_elems=free_elems(x), details={"op": token.name})


SCALAR_REDUCE_OPS = ("add", "multiply", "maximum", "minimum")


def tensor_scalar_reduce(dst, data, op0, operand0, reduce_op, reduce_res=None, reverse0=False,
                         reduce_cmd=cmd_enum.reset_reduce, reduce_init=None, reduce_res_negate=False,
                         name=None):
    """VectorE ``dst = data op0 operand0`` and ``reduce_res = reduce_op`` of it over all free
    axes, through the VectorE accumulation registers (``reduce_cmd``; ``reduce_init`` for
    ``load_reduce``); ``reduce_res_negate`` writes ``-reduce_res``."""
    o = "tensor_scalar_reduce"
    token = check_op(o, op0, "op0", ("arith", "compare", "logical"), unary=True)
    red = check_op(o, reduce_op, "reduce_op", ("arith",))
    if red.name not in SCALAR_REDUCE_OPS:
        fail(f"reduce_op={red!r} must be one of nl.add, nl.multiply, nl.maximum, nl.minimum",
             o, "reduce_op")
    cmd = cmd_enum(reduce_cmd)
    if (reduce_init is not None) != (cmd == cmd_enum.load_reduce):
        fail("reduce_init is given exactly when reduce_cmd is load_reduce", o, "reduce_init")
    d, x = on_chip(dst, o, "dst"), on_chip(data, o, "data")
    parts = same_partitions(o, dst=d, data=x)
    n = same_free(o, dst=d, data=x)
    operands = {"dst": d, "data": x}
    values = as_2d(x.read())
    if token.arity == 1:
        if operand0 not in (None, 0, 0.0):
            fail(f"operand0 must be None or 0 for the unary operator {token!r}", o, "operand0")
        values = apply(token, values, None)
    else:
        arr, r = scalar_operand(o, operand0, "operand0", parts)
        if r is not None:
            operands["operand0"] = r
        values = apply(token, arr, values) if reverse0 else apply(token, values, arr)
    values = values.astype(np.float32)
    store(d, values)
    init = None if reduce_init is None else scalar_operand(o, reduce_init, "reduce_init", parts)[0]
    regs = accumulators.update("vector", cmd, red.name, values, init, read=reduce_res is not None)
    if reduce_res is not None:
        rr = on_chip(reduce_res, o, "reduce_res")
        if rr.shape[0] != parts or free_elems(rr) != 1:
            fail(f"reduce_res {reduce_res.shape} must be [{parts}, 1]", o, "reduce_res")
        store(rr, -regs if reduce_res_negate else regs)
        operands["reduce_res"] = rr
    return record(o, "vector", operands, name=name, partitions=parts, free_elems=n,
                  details={"op": token.name, "reduce": True})


PARTITION_OPS = {"add": np.add, "maximum": np.maximum, "bitwise_or": np.bitwise_or,
                 "bitwise_and": np.bitwise_and}


def tensor_partition_reduce(dst, op, data, name=None):
    """GpSimd: reduce across partitions, ``dst[0, :] = op over p of data[p, :]`` (SBUF only;
    ops add, average, maximum, bitwise_or, bitwise_and)."""
    o = "tensor_partition_reduce"
    token = check_op(o, op, "op")
    if token.name not in PARTITION_OPS and token.name != "average":
        fail(f"op={token!r} must be one of nl.add, nl.average, nl.maximum, nl.bitwise_or, "
             f"nl.bitwise_and",
             o, "op")
    d, x = on_chip(dst, o, "dst", ("sbuf",)), on_chip(data, o, "data", ("sbuf",))
    bitvec = token.kind == "bitvec"
    values = as_2d(x.read())
    if bitvec:
        need_ints(o, token, dst=dst, data=data)
        values = _bits(values)
    else:
        values = values.astype(np.float32)
    if dst.shape[0] != 1 or free_elems(d) != values.shape[1]:
        fail(f"dst {dst.shape} must be [1, {values.shape[1]}]", o, "dst")
    if token.name == "average":
        reduced = values.mean(axis=0, keepdims=True, dtype=np.float32)
    else:
        reduced = PARTITION_OPS[token.name].reduce(values, axis=0, keepdims=True)
    store(d, reduced, bitvec)
    return record(o, "gpsimd", {"dst": d, "data": x}, name=name, partitions=values.shape[0],
                  free_elems=values.shape[1], details={"op": token.name})


BN_STATS_FMAX = 512


def bn_stats(dst, data, name=None):
    """VectorE: per partition (count, mean, var*count) of the even- and of the odd-indexed
    elements (6 values; free size <= 512)."""
    o = "bn_stats"
    d, x = on_chip(dst, o, "dst"), on_chip(data, o, "data")
    parts = same_partitions(o, dst=d, data=x)
    n = free_elems(x)
    if n > BN_STATS_FMAX:
        fail(f"data has {n} elements per partition; bn_stats takes at most {BN_STATS_FMAX} "
             f"(nl.tile_size.bn_stats_fmax)", o, "data")
    if free_elems(d) != 6:
        fail(f"dst holds {free_elems(d)} elements per partition, bn_stats writes 6", o, "dst")
    v = as_2d(x.read()).astype(np.float32)
    out = np.zeros((parts, 6), np.float32)
    for k, half in enumerate((v[:, 0::2], v[:, 1::2])):
        count = half.shape[1]
        mean = half.mean(axis=1) if count else np.zeros(parts, np.float32)
        m2 = ((half - mean[:, None]) ** 2).sum(axis=1) if count else np.zeros(parts, np.float32)
        out[:, 3 * k:3 * k + 3] = np.stack([np.full(parts, count, np.float32), mean, m2], axis=1)
    store(d, out)
    return record(o, "vector", {"dst": d, "data": x}, name=name, partitions=parts, free_elems=n)


def bn_aggr(dst, data, name=None):
    """VectorE: combine (count, mean, var*count) triples per partition into (mean, variance)."""
    o = "bn_aggr"
    d, x = on_chip(dst, o, "dst"), on_chip(data, o, "data")
    parts = same_partitions(o, dst=d, data=x)
    n = free_elems(x)
    if n % 3:
        fail(f"data has {n} elements per partition, not a multiple of 3 (count, mean, "
             f"var*count triples)", o, "data")
    if free_elems(d) != 2:
        fail(f"dst holds {free_elems(d)} elements per partition, bn_aggr writes 2", o, "dst")
    t = as_2d(x.read()).astype(np.float64).reshape(parts, -1, 3)
    count, mean, m2 = t[..., 0], t[..., 1], t[..., 2]
    total = count.sum(axis=1)
    with np.errstate(all="ignore"):
        mu = (count * mean).sum(axis=1) / total
        var = (m2 + count * (mean - mu[:, None]) ** 2).sum(axis=1) / total
    store(d, np.stack([mu, var], axis=1).astype(np.float32))
    return record(o, "vector", {"dst": d, "data": x}, name=name, partitions=parts, free_elems=n)


def top8_source_size(op, r, role) -> int:
    """Elements per partition of the tensor a top-8 instruction searches: 8 to 16384."""
    n = free_elems(r)
    if not 8 <= n <= 16384:
        fail(f"{role} has {n} elements per partition; {op} reads 8 to 16384", op, role)
    return n


def max8(dst, src, name=None):
    """VectorE: the 8 largest values of each partition, descending (8..16384 elements read)."""
    o = "max8"
    d, x = on_chip(dst, o, "dst"), on_chip(src, o, "src")
    parts = same_partitions(o, dst=d, src=x)
    n = top8_source_size(o, x, "src")
    if free_elems(d) != 8:
        fail(f"dst holds {free_elems(d)} elements per partition, max8 writes 8", o, "dst")
    v = as_2d(x.read()).astype(np.float32)
    store(d, -np.sort(-v, axis=1)[:, :8])
    return record(o, "vector", {"dst": d, "src": x}, name=name, partitions=parts, free_elems=n)
