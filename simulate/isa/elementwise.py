"""Element-wise and reduction instructions on VectorE / GpSimd / ScalarE.

Arithmetic is done in fp32 and cast to the dst dtype; when every operand is an integer tensor the
arithmetic is exact integer math (as on GpSimd, where all-int32 operands go by default). Bitvec ops
need integer operands.
"""

from __future__ import annotations

import numpy as np

from .. import context, dtypes
from ..ops import Op
from ..tensor import ndarray
from .core import as_2d, engine_name, fail, free_elems, on_chip, record, same_partitions


def check_op(op_name, token, role, kinds=("arith", "compare", "logical", "bitvec")):
    if not isinstance(token, Op) or token.kind not in kinds:
        fail(f"{role}={token!r} is not an ALU operator ({', '.join(kinds)})", op_name, role)
    return token


def apply(token: Op, a: np.ndarray, b: np.ndarray, ints: bool) -> np.ndarray:
    """``token(a, b)`` in fp32, or exactly in int64 when ``ints``."""
    if token.kind == "bitvec":
        if not ints:
            fail(f"{token!r} needs integer operands", "alu", None)
        return token.fn(a.astype(np.int64), b.astype(np.int64))
    if ints and token.name in ("add", "subtract", "multiply", "maximum", "minimum"):
        return token.fn(a.astype(np.int64), b.astype(np.int64))
    return token.fn(a.astype(np.float32), b.astype(np.float32))


def scalar_operand(op_name, value, role, parts):
    """A python number, or a [P, 1] tile broadcast along the free dim -> (array [P,1], is_int)."""
    if isinstance(value, ndarray):
        r = on_chip(value, op_name, role)
        if r.shape[0] != parts or free_elems(r) != 1:
            fail(f"{role} tile {value.shape} must be [{parts}, 1]", op_name, role)
        return as_2d(r.read()), dtypes.is_int(value.dtype)
    if isinstance(value, (bool, int, np.integer)):
        return np.full((parts, 1), int(value), dtype=np.int64), True
    return np.full((parts, 1), float(value), dtype=np.float32), False


def _engine(op_name, engine, operands, default="vector"):
    eng = engine_name(engine, default, ("vector", "gpsimd", "scalar"), op_name)
    if eng == "gpsimd" and any(r.buffer == "psum" for r in operands):
        fail("GpSimd cannot access PSUM", op_name, "engine")
    return eng


def tensor_tensor(dst, data1, data2, op, engine=None, name=None):
    """``dst = op(data1, data2)`` element-wise; same partitions and elements per partition."""
    name_ = "tensor_tensor"
    check_op(name_, op, "op")
    d, a, b = on_chip(dst, name_, "dst"), on_chip(data1, name_, "data1"), on_chip(data2, name_, "data2")
    parts = same_partitions(name_, dst=d, data1=a, data2=b)
    if not free_elems(a) == free_elems(b) == free_elems(d):
        fail(f"elements per partition differ: dst {free_elems(d)}, data1 {free_elems(a)}, "
             f"data2 {free_elems(b)}", name_)
    if a.buffer == "psum" and b.buffer == "psum":
        fail("data1 and data2 cannot both be in PSUM", name_)
    ints = dtypes.is_int(data1.dtype) and dtypes.is_int(data2.dtype)
    eng = _engine(name_, engine, (d, a, b), "gpsimd" if ints and op.kind != "bitvec" and
                  "psum" not in (d.buffer, a.buffer, b.buffer) else "vector")
    out = apply(op, as_2d(a.read()), as_2d(b.read()), ints)
    d.write(dtypes.cast(out, dst.dtype).reshape(dst.shape))
    return record(name_, eng, {"dst": d, "data1": a, "data2": b}, name=name, partitions=parts,
                  free_elems=free_elems(d))


def tensor_scalar(dst, data, op0, operand0, reverse0=False, op1=None, operand1=None,
                  reverse1=False, engine=None, name=None):
    """``dst = (data op0 operand0) op1 operand1``; operands are numbers or [P, 1] tiles."""
    name_ = "tensor_scalar"
    d, x = on_chip(dst, name_, "dst"), on_chip(data, name_, "data")
    parts = same_partitions(name_, dst=d, data=x)
    if free_elems(d) != free_elems(x):
        fail(f"elements per partition differ: dst {free_elems(d)}, data {free_elems(x)}", name_)
    eng = _engine(name_, engine, (d, x))
    target = context.current().target
    ops = [(op0, operand0, reverse0, "op0")] + ([(op1, operand1, reverse1, "op1")] if op1 is not None else [])
    if eng == "scalar" and target.nc_version == 3:
        pair = tuple(o.name for o, *_ in ops)
        if pair not in (("multiply", "add"), ("multiply",), ("add",)):
            fail(f"ScalarE on trn2 supports (multiply, add), (multiply,), (add,); got {pair}", name_, "engine")
    values, ints = as_2d(x.read()), dtypes.is_int(data.dtype)
    for token, operand, reverse, role in ops:
        check_op(name_, token, role)
        arr, op_int = scalar_operand(name_, operand, "operand" + role[-1], parts)
        both = ints and op_int
        values = apply(token, arr, values, both) if reverse else apply(token, values, arr, both)
        ints = both and values.dtype.kind in "iu"
    d.write(dtypes.cast(values, dst.dtype).reshape(dst.shape))
    return record(name_, eng, {"dst": d, "data": x}, name=name, partitions=parts,
                  free_elems=free_elems(d))


def scalar_tensor_tensor(dst, data, op0, operand0, op1, operand1, reverse0=False, reverse1=False,
                         name=None):
    """``dst = (data op0 operand0) op1 operand1`` with operand0 a number/[P,1] tile and operand1 a full tile."""
    name_ = "scalar_tensor_tensor"
    d, x, y = on_chip(dst, name_, "dst"), on_chip(data, name_, "data"), on_chip(operand1, name_, "operand1")
    parts = same_partitions(name_, dst=d, data=x, operand1=y)
    if not free_elems(d) == free_elems(x) == free_elems(y):
        fail("elements per partition of dst, data and operand1 differ", name_)
    check_op(name_, op0, "op0")
    check_op(name_, op1, "op1")
    arr, _ = scalar_operand(name_, operand0, "operand0", parts)
    v = as_2d(x.read()).astype(np.float32)
    v = apply(op0, arr, v, False) if reverse0 else apply(op0, v, arr, False)
    w = as_2d(y.read())
    v = apply(op1, w, v, False) if reverse1 else apply(op1, v, w, False)
    d.write(dtypes.cast(v, dst.dtype).reshape(dst.shape))
    return record(name_, "vector", {"dst": d, "data": x, "operand1": y}, name=name,
                  partitions=parts, free_elems=free_elems(d))


def _reduce_axes(op_name, data, axis):
    axes = (axis,) if isinstance(axis, (int, np.integer)) else tuple(axis)
    axes = tuple(sorted(a + data.ndim if a < 0 else a for a in axes))
    trailing = tuple(range(data.ndim - len(axes), data.ndim))
    if 0 in axes or axes != trailing:
        fail(f"axis={axis} must be the last free axes of a {data.ndim}-D tile (e.g. {trailing[-1]})",
             op_name, "axis")
    return axes


def tensor_reduce(dst, op, data, axis, negate=False, keepdims=False, name=None):
    """Reduce ``data`` over its trailing free ``axis`` with ``op``; ``negate`` multiplies by -1."""
    name_ = "tensor_reduce"
    token = check_op(name_, op, "op")
    if not token.is_reduction:
        fail(f"{token!r} is not a legal reduction operator", name_, "op")
    d, x = on_chip(dst, name_, "dst"), on_chip(data, name_, "data")
    parts = same_partitions(name_, dst=d, data=x)
    axes = _reduce_axes(name_, data, axis)
    values = x.read()
    ints = dtypes.is_int(data.dtype)
    flat = values.reshape(values.shape[:axes[0]] + (-1,)).astype(np.int64 if ints else np.float32)
    out = _REDUCERS[token.name](flat)
    if negate:
        out = -out
    kept = int(np.prod(values.shape[1:axes[0]], dtype=np.int64))
    if free_elems(d) != kept:
        fail(f"dst holds {free_elems(d)} elements per partition, the reduction gives {kept}",
             name_, "dst")
    d.write(dtypes.cast(out, dst.dtype).reshape(dst.shape))
    return record(name_, "vector", {"dst": d, "data": x}, name=name, partitions=parts,
                  free_elems=free_elems(x))


_REDUCERS = {
    "add": lambda v: np.add.reduce(v, axis=-1), "subtract": lambda v: v[..., 0] - v[..., 1:].sum(-1),
    "multiply": lambda v: np.multiply.reduce(v, axis=-1),
    "maximum": lambda v: np.maximum.reduce(v, axis=-1),
    "minimum": lambda v: np.minimum.reduce(v, axis=-1),
    "abs_max": lambda v: np.abs(v).max(axis=-1), "abs_min": lambda v: np.abs(v).min(axis=-1),
    "logical_and": lambda v: np.all(v != 0, axis=-1).astype(np.float32),
    "logical_or": lambda v: np.any(v != 0, axis=-1).astype(np.float32),
    "logical_xor": lambda v: (np.sum(v != 0, axis=-1) % 2).astype(np.float32),
    "bitwise_and": lambda v: np.bitwise_and.reduce(v, axis=-1),
    "bitwise_or": lambda v: np.bitwise_or.reduce(v, axis=-1),
    "bitwise_xor": lambda v: np.bitwise_xor.reduce(v, axis=-1),
}


def reciprocal(dst, data, name=None):
    """``dst = 1 / data`` on VectorE (fp32)."""
    name_ = "reciprocal"
    d, x = on_chip(dst, name_, "dst"), on_chip(data, name_, "data")
    parts = same_partitions(name_, dst=d, data=x)
    with np.errstate(divide="ignore"):
        out = np.float32(1.0) / as_2d(x.read()).astype(np.float32)
    d.write(dtypes.cast(out, dst.dtype).reshape(dst.shape))
    return record(name_, "vector", {"dst": d, "data": x}, name=name, partitions=parts,
                  free_elems=free_elems(d))


def tensor_copy_predicated(dst, src, predicate, reverse_pred=False, name=None):
    """Copy ``src`` into ``dst`` where ``predicate`` is non-zero (zero with ``reverse_pred``)."""
    name_ = "tensor_copy_predicated"
    d, s, p = on_chip(dst, name_, "dst"), on_chip(src, name_, "src"), on_chip(predicate, name_, "predicate")
    parts = same_partitions(name_, dst=d, src=s, predicate=p)
    if not dtypes.is_int(predicate.dtype):
        fail(f"predicate must be an integer tile (uint8/16/32), got {predicate.dtype.name}", name_,
             "predicate")
    keep = as_2d(p.read()) != 0
    if reverse_pred:
        keep = ~keep
    values = dtypes.cast(as_2d(s.read()), dst.dtype)
    d.write(np.where(keep, values, as_2d(d.read())).reshape(dst.shape))
    return record(name_, "vector", {"dst": d, "src": s, "predicate": p}, name=name,
                  partitions=parts, free_elems=free_elems(d))
