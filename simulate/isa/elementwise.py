"""Element-wise instructions: ``tensor_tensor``, ``tensor_scalar``, ``scalar_tensor_tensor``,
``reciprocal``, ``tensor_copy_predicated``.

Arithmetic is fp32 math, cast to the dst dtype (round half to even, saturating, for integer dst).
Exception, as documented for ``tensor_tensor``: on GpSimd, all-int32/uint32 operands use exact
integer math (add/subtract/multiply/max/min); modelled the same for ``tensor_scalar`` on GpSimd.
So int32 index arithmetic on VectorE (the ``tensor_scalar`` default) is exact only below 2**24.
Bitvec operators treat integer inputs as 32-bit patterns (no conversion) and need integer
operands and dst; their results keep the bit pattern.
"""

from __future__ import annotations

import numpy as np

from .. import context, dtypes
from ..ops import Op
from ..tensor import ndarray
from .core import as_2d, engine_name, fail, free_elems, on_chip, record, same_partitions

ALU_KINDS = ("arith", "compare", "logical", "bitvec")
INT32 = (dtypes.int32, dtypes.uint32)


def check_op(op_name, token, role, kinds=ALU_KINDS, unary=False):
    """``token`` must be an ALU operator of one of ``kinds`` (``unary``: also abs/square/relu/
    rsqrt/reciprocal) available on the target."""
    ok = isinstance(token, Op) and (token.kind in kinds or (unary and token.alu_unary))
    if not ok:
        extra = " or a unary ALU op (abs, square, relu, rsqrt, reciprocal)" if unary else ""
        fail(f"{role}={token!r} is not an ALU operator ({', '.join(kinds)}){extra}", op_name, role)
    target = context.current().target
    if token.min_nc > target.nc_version:
        fail(f"{role}={token!r} needs NeuronCore-v{token.min_nc}+ ({target.name} is "
             f"v{target.nc_version})", op_name, role)
    return token


def _bits(a: np.ndarray) -> np.ndarray:
    return (np.asarray(a).astype(np.int64) & 0xFFFFFFFF).astype(np.uint32)


def apply(token: Op, a, b, exact_ints=False) -> np.ndarray:
    """``token(a, b)`` (``b`` ignored for unary ops): fp32 math, exact integer math when
    ``exact_ints``, bit patterns (uint32) for bitvec operators."""
    if token.kind == "bitvec":
        if token.arity == 1:
            return np.invert(_bits(a))
        if token.name == "left_shift":
            return (_bits(a).astype(np.uint64) << (_bits(b) & 31)).astype(np.uint32)
        if token.name == "right_shift":      # logical shift
            return _bits(a) >> (_bits(b) & 31)
        return token.fn(_bits(a), _bits(b))
    if token.arity == 1:
        return token.fn(np.asarray(a).astype(np.float32)).astype(np.float32)
    if exact_ints and token.name in ("add", "subtract", "multiply", "maximum", "minimum"):
        return token.fn(np.asarray(a).astype(np.int64), np.asarray(b).astype(np.int64))
    return np.asarray(token.fn(np.asarray(a).astype(np.float32),
                               np.asarray(b).astype(np.float32)), dtype=np.float32)


def store(d, values: np.ndarray, bitvec=False) -> None:
    """Write results to ``d`` (a Resolved dst): cast as the engines do, bit patterns for bitvec."""
    dtype = d.tensor.dtype
    out = values.astype(dtype) if bitvec else dtypes.cast(values, dtype)
    d.write(out.reshape(d.shape))


def scalar_operand(op_name, value, role, parts):
    """A number or a [P, 1] tile broadcast along the free dim -> (values [P, 1], resolved or None)."""
    if isinstance(value, ndarray):
        r = on_chip(value, op_name, role)
        if r.shape[0] != parts or free_elems(r) != 1:
            fail(f"{role} tile {value.shape} must be [{parts}, 1]", op_name, role)
        return as_2d(r.read()), r
    if value is None:
        fail(f"{role} is missing", op_name, role)
    if isinstance(value, (bool, int, np.integer)):
        return np.full((parts, 1), int(value), dtype=np.int64), None
    return np.full((parts, 1), float(value), dtype=np.float32), None


def same_free(op_name, **operands):
    sizes = {role: free_elems(r) for role, r in operands.items()}
    if len(set(sizes.values())) != 1:
        fail(f"elements per partition differ: {sizes}", op_name)
    return next(iter(sizes.values()))


def need_ints(op_name, token, **tensors):
    for role, t in tensors.items():
        if t is not None and not dtypes.is_int(t.dtype):
            fail(f"bitvec operator {token!r} needs integer tensors; {role} is {t.dtype.name}",
                 op_name, role)


def no_psum_on_gpsimd(op_name, eng, *operands):
    if eng == "gpsimd" and any(r is not None and r.buffer == "psum" for r in operands):
        fail("GpSimd cannot access PSUM", op_name, "engine")


def not_both_psum(op_name, a, b, roles):
    if a.buffer == "psum" and b.buffer == "psum":
        fail(f"{roles[0]} and {roles[1]} cannot both be in PSUM", op_name)


def tensor_tensor(dst, data1, data2, op, engine=None, name=None):
    """``dst = op(data1, data2)`` element-wise (VectorE; GpSimd for ``nl.power`` and, by default,
    all-int32/uint32 operands outside PSUM)."""
    o = "tensor_tensor"
    token = check_op(o, op, "op")
    if token.arity != 2:
        fail(f"op={token!r} is unary; tensor_tensor needs a binary operator", o, "op")
    d, a, b = on_chip(dst, o, "dst"), on_chip(data1, o, "data1"), on_chip(data2, o, "data2")
    parts = same_partitions(o, dst=d, data1=a, data2=b)
    n = same_free(o, dst=d, data1=a, data2=b)
    not_both_psum(o, a, b, ("data1", "data2"))
    bitvec = token.kind == "bitvec"
    if bitvec:
        need_ints(o, token, dst=dst, data1=data1, data2=data2)
    in_psum = "psum" in (d.buffer, a.buffer, b.buffer)
    all_int32 = all(t.dtype in INT32 for t in (dst, data1, data2))
    default = "gpsimd" if token.name == "power" or (all_int32 and not bitvec and not in_psum) \
        else "vector"
    eng = engine_name(engine, default, ("vector", "gpsimd"), o)
    if token.name == "power" and eng != "gpsimd":
        fail("nl.power runs on GpSimd only", o, "engine")
    no_psum_on_gpsimd(o, eng, d, a, b)
    out = apply(token, as_2d(a.read()), as_2d(b.read()), exact_ints=eng == "gpsimd" and all_int32)
    store(d, out, bitvec)
    return record(o, eng, {"dst": d, "data1": a, "data2": b}, name=name, partitions=parts,
                  free_elems=n, details={"op": token.name})


def _scalar_engine_pairs(o, ops, target):
    if target.nc_version == 3:
        pair = tuple(t.name for t, *_ in ops)
        if pair not in (("multiply", "add"), ("multiply",), ("add",)):
            fail(f"ScalarE on trn2 supports op pairs (multiply, add), (multiply, None), "
                 f"(add, None); got {pair}", o, "engine")


def tensor_scalar(dst, data, op0, operand0, reverse0=False, op1=None, operand1=None,
                  reverse1=False, engine=None, name=None):
    """``dst = (data op0 operand0) op1 operand1``; operands are numbers or [P, 1] tiles,
    ``reverseN`` swaps an operator's inputs; unary ALU ops ignore their operand (None or 0)."""
    o = "tensor_scalar"
    d, x = on_chip(dst, o, "dst"), on_chip(data, o, "data")
    parts = same_partitions(o, dst=d, data=x)
    n = same_free(o, dst=d, data=x)
    if op1 is not None and getattr(op1, "name", None) == "bypass":
        op1 = None
    if op1 is None and operand1 is not None:
        fail("operand1 given without op1", o, "operand1")
    stages = [(check_op(o, op0, "op0", unary=True), operand0, reverse0, "operand0")]
    if op1 is not None:
        stages.append((check_op(o, op1, "op1", unary=True), operand1, reverse1, "operand1"))
    bitvec = {t.kind == "bitvec" for t, *_ in stages}
    if len(bitvec) != 1:
        fail("op0 and op1 must both be bitvec or both arithmetic operators", o, "op1")
    bitvec = bitvec.pop()
    eng = engine_name(engine, "vector", ("vector", "scalar", "gpsimd"), o)
    if bitvec:
        need_ints(o, stages[0][0], dst=dst, data=data)
        if eng != "vector":
            fail(f"bitvec operators run on VectorE only, not {eng}", o, "engine")
    if eng == "scalar":
        _scalar_engine_pairs(o, stages, context.current().target)
    no_psum_on_gpsimd(o, eng, d, x)
    operands = {"dst": d, "data": x}
    values = as_2d(x.read())
    exact = eng == "gpsimd" and data.dtype in INT32 and dst.dtype in INT32
    for token, operand, reverse, role in stages:
        if token.arity == 1:
            if operand not in (None, 0, 0.0):
                fail(f"{role} must be None or 0 for the unary operator {token!r}", o, role)
            values = apply(token, values, None)
            continue
        arr, r = scalar_operand(o, operand, role, parts)
        if r is not None:
            operands[role] = r
            no_psum_on_gpsimd(o, eng, r)
        ints = exact and arr.dtype.kind in "iu" and values.dtype.kind in "iu"
        values = apply(token, arr, values, ints) if reverse else apply(token, values, arr, ints)
    store(d, values, bitvec)
    return record(o, eng, operands, name=name, partitions=parts, free_elems=n,
                  details={"op": tuple(t.name for t, *_ in stages)})


def scalar_tensor_tensor(dst, data, op0, operand0, op1, operand1, reverse0=False, reverse1=False,
                         name=None):
    """VectorE ``dst = (data op0 operand0) op1 operand1``: operand0 a number or [P, 1] tile,
    operand1 a full tile (data and operand1 not both in PSUM); arithmetic operators only."""
    o = "scalar_tensor_tensor"
    d, x, y = on_chip(dst, o, "dst"), on_chip(data, o, "data"), on_chip(operand1, o, "operand1")
    parts = same_partitions(o, dst=d, data=x, operand1=y)
    n = same_free(o, dst=d, data=x, operand1=y)
    not_both_psum(o, x, y, ("data", "operand1"))
    kinds = ("arith", "compare", "logical")
    t0, t1 = check_op(o, op0, "op0", kinds), check_op(o, op1, "op1", kinds)
    arr, r0 = scalar_operand(o, operand0, "operand0", parts)
    v = as_2d(x.read())
    v = apply(t0, arr, v) if reverse0 else apply(t0, v, arr)
    w = as_2d(y.read())
    v = apply(t1, w, v) if reverse1 else apply(t1, v, w)
    store(d, v)
    operands = {"dst": d, "data": x, "operand1": y}
    if r0 is not None:
        operands["operand0"] = r0
    return record(o, "vector", operands, name=name, partitions=parts, free_elems=n,
                  details={"op": (t0.name, t1.name)})


def reciprocal(dst, data, name=None):
    """VectorE ``dst = 1 / data`` in fp32."""
    o = "reciprocal"
    d, x = on_chip(dst, o, "dst"), on_chip(data, o, "data")
    parts = same_partitions(o, dst=d, data=x)
    n = same_free(o, dst=d, data=x)
    with np.errstate(divide="ignore"):
        out = np.float32(1.0) / as_2d(x.read()).astype(np.float32)
    store(d, out)
    return record(o, "vector", {"dst": d, "data": x}, name=name, partitions=parts, free_elems=n)


PREDICATE_TYPES = (dtypes.uint8, dtypes.uint16, dtypes.uint32)


def tensor_copy_predicated(dst, src, predicate, reverse_pred=False, name=None):
    """VectorE: ``dst = src`` where ``predicate != 0`` (``== 0`` with ``reverse_pred``), dst kept
    elsewhere. ``src`` is a tile (same dtype as dst) or a number; predicate uint8/16/32; src and
    predicate not both in PSUM."""
    o = "tensor_copy_predicated"
    d, p = on_chip(dst, o, "dst"), on_chip(predicate, o, "predicate")
    operands = {"dst": d, "predicate": p}
    if predicate.dtype not in PREDICATE_TYPES:
        fail(f"predicate must be uint8/uint16/uint32, got {predicate.dtype.name}", o, "predicate")
    if isinstance(src, ndarray):
        s = on_chip(src, o, "src")
        parts = same_partitions(o, dst=d, src=s, predicate=p)
        n = same_free(o, dst=d, src=s, predicate=p)
        not_both_psum(o, s, p, ("src", "predicate"))
        if src.dtype != dst.dtype:
            fail(f"src dtype {src.dtype.name} must equal dst dtype {dst.dtype.name}", o, "src")
        values = as_2d(s.read())
        operands["src"] = s
    else:
        parts = same_partitions(o, dst=d, predicate=p)
        n = same_free(o, dst=d, predicate=p)
        values = dtypes.cast(np.full((parts, n), src, np.float32), dst.dtype)
    keep = as_2d(p.read()) != 0
    if reverse_pred:
        keep = ~keep
    d.write(np.where(keep, values, as_2d(d.read())).reshape(d.shape))
    return record(o, "vector", operands, name=name, partitions=parts, free_elems=n)
