"""ScalarE ``activation`` (and its reduce forms) and the NeuronCore-v4 VectorE ``exponential``.

``activation(dst, op, data, bias, scale)``: ``dst = op(data * scale + bias)`` in fp32. With
``reduce_res`` the per-partition sum of the result goes into the engine's 128 accumulation
registers (``reduce_cmd``: ``reset_reduce``/``idle`` start from zero, ``reduce`` adds to what earlier
instructions left, ``reset`` only clears) and is read out into ``reduce_res`` [P, 1].
"""

from __future__ import annotations

import numpy as np

from .. import context, dtypes
from ..ops import Op
from ..tensor import ndarray
from .core import as_2d, fail, free_elems, on_chip, record, same_partitions
from .enums import reduce_cmd as reduce_enum


def _registers(launch):
    regs = getattr(launch, "act_registers", None)
    if regs is None:
        regs = np.zeros(launch.target.pmax, dtype=np.float32)
        launch.act_registers = regs
    return regs


def _per_partition(op_name, value, role, parts, allow_scalar):
    if isinstance(value, ndarray):
        r = on_chip(value, op_name, role)
        if r.shape[0] != parts or free_elems(r) != 1:
            fail(f"{role} {value.shape} must be a [{parts}, 1] tile", op_name, role)
        return as_2d(r.read()).astype(np.float32), r
    if not allow_scalar:
        fail(f"a scalar {role} needs NeuronCore-v3+; pass a [P, 1] tile", op_name, role)
    return np.full((parts, 1), float(value), dtype=np.float32), None


def activation(dst, op, data, bias=None, scale=1.0, reduce_op=None, reduce_res=None,
               reduce_cmd=reduce_enum.idle, name=None):
    """``dst = op(data * scale + bias)`` with an optional free-axis sum into ``reduce_res``."""
    op_name = "activation"
    if not isinstance(op, Op) or op.arity != 1:
        fail(f"op={op!r} is not an activation function", op_name, "op")
    launch = context.current()
    d, x = on_chip(dst, op_name, "dst"), on_chip(data, op_name, "data")
    parts = same_partitions(op_name, dst=d, data=x)
    if free_elems(d) != free_elems(x):
        fail(f"elements per partition differ: dst {free_elems(d)}, data {free_elems(x)}", op_name)
    operands = {"dst": d, "data": x}
    sc, r = _per_partition(op_name, scale, "scale", parts, True)
    if r is not None:
        operands["scale"] = r
    b = np.zeros((parts, 1), np.float32)
    if bias is not None:
        b, r = _per_partition(op_name, bias, "bias", parts, launch.target.nc_version >= 3)
        if r is not None:
            operands["bias"] = r
    out = op.fn(as_2d(x.read()).astype(np.float32) * sc + b).astype(np.float32)
    d.write(dtypes.cast(out, dst.dtype).reshape(dst.shape))
    cmd = reduce_enum(reduce_cmd)
    if reduce_op is not None and getattr(reduce_op, "name", None) != "add":
        fail(f"reduce_op={reduce_op!r}: activation reduces with nl.add only", op_name, "reduce_op")
    if reduce_res is not None or cmd != reduce_enum.idle:
        regs = _registers(launch)
        if cmd in (reduce_enum.reset, reduce_enum.reset_reduce, reduce_enum.idle):
            regs[:parts] = 0.0
        if cmd != reduce_enum.reset:
            regs[:parts] += out.sum(axis=1, dtype=np.float32)
        if reduce_res is not None:
            rr = on_chip(reduce_res, op_name, "reduce_res")
            if rr.shape[0] != parts or free_elems(rr) != 1:
                fail(f"reduce_res {reduce_res.shape} must be [{parts}, 1]", op_name, "reduce_res")
            rr.write(dtypes.cast(regs[:parts].reshape(parts, 1), reduce_res.dtype).reshape(rr.shape))
            operands["reduce_res"] = rr
    return record(op_name, "scalar", operands, name=name, partitions=parts,
                  free_elems=free_elems(x), details={"op": op.name, "reduce": reduce_res is not None})


def activation_reduce(dst, op, data, reduce_op, reduce_res, bias=None, scale=1.0, name=None):
    """Legacy form: ``activation(..., reduce_cmd=reset_reduce)``."""
    return activation(dst, op, data, bias=bias, scale=scale, reduce_op=reduce_op,
                      reduce_res=reduce_res, reduce_cmd=reduce_enum.reset_reduce, name=name)


def exponential(dst, src, max_value=0.0, reduce_res=None, reduce_cmd=reduce_enum.idle,
                reduce_init=0.0, name=None):
    """NeuronCore-v4 VectorE: ``dst = exp(src - max_value)`` with an optional running sum."""
    op_name = "exponential"
    if context.current().target.nc_version < 4:
        from ..errors import TargetError
        context.fail(TargetError, "exponential is a NeuronCore-v4 (trn3) instruction",
                     op=op_name, operand=None)
    d, x = on_chip(dst, op_name, "dst"), on_chip(src, op_name, "src")
    parts = same_partitions(op_name, dst=d, src=x)
    mx, _ = _per_partition(op_name, max_value, "max_value", parts, True)
    out = np.exp(as_2d(x.read()).astype(np.float32) - mx).astype(np.float32)
    d.write(dtypes.cast(out, dst.dtype).reshape(dst.shape))
    if reduce_res is not None:
        rr = on_chip(reduce_res, op_name, "reduce_res")
        total = out.sum(axis=1, keepdims=True) + np.float32(reduce_init)
        rr.write(dtypes.cast(total, reduce_res.dtype).reshape(rr.shape))
    return record(op_name, "vector", {"dst": d, "src": x}, name=name, partitions=parts,
                  free_elems=free_elems(x))
