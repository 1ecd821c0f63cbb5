"""ScalarE ``activation`` / ``activation_reduce`` and the NeuronCore-v4 VectorE ``exponential``.

``activation(dst, op, data, bias, scale)``: ``dst = op(data * scale + bias)`` in fp32; ``scale`` a
number or [P, 1] tile, ``bias`` a [P, 1] tile (a number from NeuronCore-v3). With ``reduce_op``
(``nl.add`` only) the per-partition sum goes through the ScalarE accumulation registers and
``reduce_res`` [P, 1] reads them out (see ``accumulators`` for ``reduce_cmd``).
"""

from __future__ import annotations

import numpy as np

from .. import context
from ..errors import TargetError
from ..ops import Op
from ..tensor import ndarray
from . import accumulators
from .core import as_2d, fail, free_elems, on_chip, record, same_partitions
from .elementwise import same_free, store
from .enums import reduce_cmd as cmd_enum


def per_partition(op_name, value, role, parts, allow_scalar=True):
    """A number or a [P, 1] tile -> (fp32 [P, 1], resolved tile or None)."""
    if isinstance(value, ndarray):
        r = on_chip(value, op_name, role)
        if r.shape[0] != parts or free_elems(r) != 1:
            fail(f"{role} {value.shape} must be a [{parts}, 1] tile", op_name, role)
        return as_2d(r.read()).astype(np.float32), r
    if not allow_scalar:
        target = context.current().target
        fail(f"a scalar {role} needs NeuronCore-v3+ ({target.name} is v{target.nc_version}); "
             f"pass a [P, 1] tile", op_name, role)
    return np.full((parts, 1), float(value), dtype=np.float32), None


def _reduce_res(op_name, reduce_res, parts, regs, operands):
    rr = on_chip(reduce_res, op_name, "reduce_res")
    if rr.shape[0] != parts or free_elems(rr) != 1:
        fail(f"reduce_res {reduce_res.shape} must be [{parts}, 1]", op_name, "reduce_res")
    store(rr, regs)
    operands["reduce_res"] = rr


def activation(dst, op, data, bias=None, scale=1.0, reduce_op=None, reduce_res=None,
               reduce_cmd=cmd_enum.idle, name=None):
    """``dst = op(data * scale + bias)`` with an optional free-axis sum into ``reduce_res``."""
    o = "activation"
    if not isinstance(op, Op) or op.arity != 1 or op.kind != "activation":
        fail(f"op={op!r} is not an activation function", o, "op")
    target = context.current().target
    d, x = on_chip(dst, o, "dst"), on_chip(data, o, "data")
    parts = same_partitions(o, dst=d, data=x)
    n = same_free(o, dst=d, data=x)
    operands = {"dst": d, "data": x}
    sc, r = per_partition(o, scale, "scale", parts)
    if r is not None:
        operands["scale"] = r
    b = np.zeros((parts, 1), np.float32)
    if bias is not None:
        b, r = per_partition(o, bias, "bias", parts, allow_scalar=target.nc_version >= 3)
        if r is not None:
            operands["bias"] = r
    if reduce_op is not None and getattr(reduce_op, "name", None) != "add":
        fail(f"reduce_op={reduce_op!r}: activation reduces with nl.add only", o, "reduce_op")
    with np.errstate(all="ignore"):
        out = op.fn(as_2d(x.read()).astype(np.float32) * sc + b).astype(np.float32)
    store(d, out)
    cmd = cmd_enum(reduce_cmd)
    if cmd == cmd_enum.load_reduce:
        fail("reduce_cmd=load_reduce is not available on activation", o, "reduce_cmd")
    if cmd in (cmd_enum.reduce, cmd_enum.reset_reduce) and reduce_op is None:
        reduce_op = Op("add", np.add, 2, "arith")     # the only reduction ScalarE does
    regs = accumulators.update("scalar", cmd, getattr(reduce_op, "name", None), out,
                               read=reduce_res is not None)
    return _finish(o, op, regs, reduce_res, parts, n, operands, name)


def _finish(o, op, regs, reduce_res, parts, n, operands, name):
    """Read the accumulators out into ``reduce_res`` (if given) and record the instruction."""
    if reduce_res is not None:
        _reduce_res(o, reduce_res, parts, regs, operands)
    return record(o, "scalar", operands, name=name, partitions=parts, free_elems=n,
                  details={"op": op.name, "reduce": reduce_res is not None})


def activation_reduce(dst, op, data, reduce_op, reduce_res, bias=None, scale=1.0, name=None):
    """Legacy form of ``activation(..., reduce_cmd=reset_reduce)``."""
    return activation(dst, op, data, bias=bias, scale=scale, reduce_op=reduce_op,
                      reduce_res=reduce_res, reduce_cmd=cmd_enum.reset_reduce, name=name)


def exponential(dst, src, max_value=0.0, reduce_res=None, reduce_cmd=cmd_enum.idle,
                reduce_init=0.0, name=None):
    """NeuronCore-v4 VectorE: ``dst = exp(src - max_value)`` (max_value a number or [P, 1] tile)
    with an optional sum through the VectorE registers (``reduce_init`` for ``load_reduce``)."""
    o = "exponential"
    target = context.current().target
    if target.nc_version < 4:
        context.fail(TargetError, f"exponential is a NeuronCore-v4 (trn3) instruction; "
                     f"{target.name} is v{target.nc_version}", op=o, operand=None)
    cmd = cmd_enum(reduce_cmd)
    d, x = on_chip(dst, o, "dst"), on_chip(src, o, "src")
    parts = same_partitions(o, dst=d, src=x)
    n = same_free(o, dst=d, src=x)
    if cmd != cmd_enum.load_reduce and not (isinstance(reduce_init, (int, float))
                                            and reduce_init == 0):
        fail("reduce_init must be 0.0 unless reduce_cmd is load_reduce", o, "reduce_init")
    mx, r = per_partition(o, max_value, "max_value", parts)
    operands = {"dst": d, "src": x}
    if r is not None:
        operands["max_value"] = r
    with np.errstate(all="ignore"):
        out = np.exp(as_2d(x.read()).astype(np.float32) - mx).astype(np.float32)
    store(d, out)
    init = per_partition(o, reduce_init, "reduce_init", parts)[0]
    regs = accumulators.update("vector", cmd, "add", out, init, read=reduce_res is not None)
    if reduce_res is not None:
        _reduce_res(o, reduce_res, parts, regs, operands)
    return record(o, "vector", operands, name=name, partitions=parts, free_elems=n,
                  details={"reduce": reduce_res is not None})


ACTIVATE2_PAIRS = {("multiply", "add"), ("multiply", "subtract"), ("multiply", "bypass"),
                   ("add", "bypass"), ("subtract", "bypass"), ("bypass", "bypass")}


def activate2(dst, op, data, imm0, imm1, op0, op1, relu_param=0.0, reverse0=False,
              reverse1=False, reduce_op=None, reduce_res=None, reduce_cmd=cmd_enum.idle,
              name=None):
    """NeuronCore-v4 ScalarE: ``dst = op((data op0 imm0) op1 imm1)`` (operands swapped by
    ``reverse0``/``reverse1``) with the optional accumulator reduction of ``activation``.
    ``relu_param`` is the negative slope of ``prelu``."""
    o = "activate2"
    target = context.current().target
    if target.nc_version < 4:
        context.fail(TargetError, f"{o} needs NeuronCore-v4+ (target {target.name})", op=o)
    if not isinstance(op, Op) or op.arity != 1 or op.kind != "activation":
        fail(f"op={op!r} is not an activation function", o, "op")
    names = (getattr(op0, "name", None), getattr(op1, "name", None))
    if names not in ACTIVATE2_PAIRS:
        fail(f"(op0, op1) = {names}: activate2 takes {sorted(ACTIVATE2_PAIRS)}", o, "op0")
    if reverse0 and names[0] == "bypass" or reverse1 and names[1] == "bypass":
        fail("reverse0/reverse1 need op0/op1 set", o, "reverse0" if reverse0 else "reverse1")
    d, x = on_chip(dst, o, "dst"), on_chip(data, o, "data")
    parts = same_partitions(o, dst=d, data=x)
    n = same_free(o, dst=d, data=x)
    operands = {"dst": d, "data": x}
    imms = []
    for role, v in (("imm0", imm0), ("imm1", imm1), ("relu_param", relu_param)):
        vals, r = per_partition(o, v, role, parts)
        if r is not None:
            operands[role] = r
        imms.append(vals)
    if isinstance(imm0, ndarray) and isinstance(imm1, ndarray) and imm0.dtype != imm1.dtype:
        fail(f"imm0 ({imm0.dtype.name}) and imm1 ({imm1.dtype.name}) must share a dtype", o,
             "imm1")
    values = as_2d(x.read()).astype(np.float32)
    with np.errstate(all="ignore"):
        for name_k, imm, rev in ((names[0], imms[0], reverse0), (names[1], imms[1], reverse1)):
            if name_k == "bypass":
                continue
            a, b = (imm, values) if rev else (values, imm)
            values = {"multiply": np.multiply, "add": np.add, "subtract": np.subtract}[name_k](a, b)
        if op.name == "prelu":
            out = np.where(values >= 0, values, imms[2] * values).astype(np.float32)
        else:
            out = op.fn(values.astype(np.float32)).astype(np.float32)
    store(d, out)
    cmd = cmd_enum(reduce_cmd)
    if reduce_op is not None and getattr(reduce_op, "name", None) not in accumulators.IDENTITY:
        fail(f"reduce_op={reduce_op!r} is not a reduction", o, "reduce_op")
    regs = accumulators.update("scalar", cmd, getattr(reduce_op, "name", None), out,
                               read=reduce_res is not None)
    return _finish(o, op, regs, reduce_res, parts, n, operands, name)
