"""VectorE running (scan) instructions: ``tensor_tensor_scan`` and ``tensor_scalar_cumulative``.

Both walk each partition's free elements in order, in fp32, casting results to ``dst.dtype``.
``tensor_tensor_scan``: ``r[i] = op1(op0(data0[i], r[i-1]), data1[i])`` with ``r[-1] = initial``
(``reverse0``/``reverse1`` swap each operator's operands). ``tensor_scalar_cumulative``:
``reg = op1(op0(src[i], imm0), reg); dst[i] = reg`` through the VectorE accumulation registers.
"""

from __future__ import annotations

import numpy as np

from .. import dtypes
from . import accumulators
from .core import as_2d, fail, on_chip, record, same_partitions
from .elementwise import apply, check_op, not_both_psum, same_free, scalar_operand, store
from .enums import reduce_cmd as cmd_enum

CUMULATIVE_OPS = ("add", "subtract", "multiply", "maximum", "minimum")
_CUMULATIVE_START = {**accumulators.IDENTITY, "subtract": 0.0}      # reset_reduce start values


def tensor_tensor_scan(dst, data0, data1, initial, op0, op1, reverse0=False, reverse1=False,
                       name=None):
    """``dst[:, i] = op1(op0(data0[:, i], dst[:, i-1]), data1[:, i])``, ``dst[:, -1] = initial``."""
    o = "tensor_tensor_scan"
    t0, t1 = check_op(o, op0, "op0", ("arith",)), check_op(o, op1, "op1", ("arith",))
    d, a, b = on_chip(dst, o, "dst"), on_chip(data0, o, "data0"), on_chip(data1, o, "data1")
    parts = same_partitions(o, dst=d, data0=a, data1=b)
    n = same_free(o, dst=d, data0=a, data1=b)
    not_both_psum(o, a, b, ("data0", "data1"))
    operands = {"dst": d, "data0": a, "data1": b}
    prev, r = scalar_operand(o, initial, "initial", parts)
    if r is not None:
        operands["initial"] = r
    prev = prev.astype(np.float32).reshape(parts)
    x, y = as_2d(a.read()).astype(np.float32), as_2d(b.read()).astype(np.float32)
    out = np.empty((parts, n), np.float32)
    for i in range(n):
        u = apply(t0, prev, x[:, i]) if reverse0 else apply(t0, x[:, i], prev)
        prev = apply(t1, y[:, i], u) if reverse1 else apply(t1, u, y[:, i])
        out[:, i] = prev
    store(d, out)
    return record(o, "vector", operands, name=name, partitions=parts, free_elems=n,
                  details={"op": f"{t0.name},{t1.name}"})


def tensor_scalar_cumulative(dst, src, op0, op1, imm0, imm1=None,
                             reduce_cmd=cmd_enum.reset_reduce, name=None):
    """Running ``op1`` over ``op0(src, imm0)`` per partition (registers per ``reduce_cmd``;
    ``imm1`` is the start value of ``load_reduce``)."""
    o = "tensor_scalar_cumulative"
    t0 = check_op(o, op0, "op0", ("arith",))
    t1 = check_op(o, op1, "op1", ("arith",))
    if t1.name not in CUMULATIVE_OPS:
        fail(f"op1={t1!r} must be one of nl.{', nl.'.join(CUMULATIVE_OPS)}", o, "op1")
    d, x = on_chip(dst, o, "dst"), on_chip(src, o, "src")
    for role, t in (("dst", dst), ("src", src)):
        if t.dtype in (dtypes.int32, dtypes.uint32) or dtypes.is_packed(t.dtype):
            fail(f"{role} dtype {t.dtype.name} is not supported (no 32-bit integer or packed "
                 f"types)", o, role)
    parts = same_partitions(o, dst=d, src=x)
    n = same_free(o, dst=d, src=x)
    operands = {"dst": d, "src": x}
    scalar, r = scalar_operand(o, imm0, "imm0", parts)
    if r is not None:
        operands["imm0"] = r
    cmd = cmd_enum(reduce_cmd)
    regs = accumulators.registers("vector")
    if cmd == cmd_enum.reset_reduce:
        reg = np.full(parts, _CUMULATIVE_START[t1.name], np.float32)
    elif cmd == cmd_enum.load_reduce:
        if imm1 is None:
            fail("reduce_cmd=load_reduce needs imm1", o, "imm1")
        reg = scalar_operand(o, imm1, "imm1", parts)[0].astype(np.float32).reshape(parts)
    elif cmd == cmd_enum.reduce:
        reg = regs[:parts].copy()
    else:
        fail(f"reduce_cmd={cmd.name} is not one of reset_reduce, reduce, load_reduce", o,
             "reduce_cmd")
    values = apply(t0, as_2d(x.read()), scalar)
    out = np.empty((parts, n), np.float32)
    for i in range(n):
        reg = apply(t1, values[:, i], reg)
        out[:, i] = reg
    regs[:parts] = reg
    store(d, out)
    return record(o, "vector", operands, name=name, partitions=parts, free_elems=n,
                  details={"op": f"{t0.name},{t1.name}"})


