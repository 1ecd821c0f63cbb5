"""Engine accumulation registers: one fp32 register per partition lane on ScalarE and on VectorE.

``reduce_cmd`` controls them (per engine, per program instance):
- ``reset``: set to the identity of ``reduce_op``; this instruction's values are not added.
- ``reset_reduce``: identity, then reduce this instruction's per-partition result into them.
- ``reduce``: reduce this instruction's result on top of what earlier instructions left.
- ``load_reduce``: load ``reduce_init`` (number or [P, 1] values), then reduce.
- ``idle``: leave them alone. Choice: ``idle`` with a ``reduce_op`` and a ``reduce_res`` behaves as
  ``reset_reduce`` (the form ``activation_reduce`` is documented as, and how kernels that pass
  ``reduce_res`` without ``reduce_cmd`` are written); ``idle`` with ``reduce_res`` but no
  ``reduce_op`` only reads the registers out.
Registers start as NaN (never written), so reading them before a reset shows up as NaN.
"""

from __future__ import annotations

import numpy as np

from .. import context
from .enums import reduce_cmd as cmd_enum

IDENTITY = {"add": 0.0, "multiply": 1.0, "maximum": -np.inf, "minimum": np.inf,
            "abs_max": 0.0, "abs_min": np.inf}


def row_reduce(op_name: str, values: np.ndarray) -> np.ndarray:
    """Per-partition reduction of fp32 ``values`` [P, F] over the free axis -> [P]."""
    v = values.astype(np.float32)
    with np.errstate(all="ignore"):
        if op_name == "add":
            return v.sum(axis=1, dtype=np.float32)
        if op_name == "multiply":
            return v.prod(axis=1, dtype=np.float32)
        if op_name == "maximum":
            return v.max(axis=1)
        if op_name == "minimum":
            return v.min(axis=1)
        if op_name == "abs_max":
            return np.abs(v).max(axis=1)
        if op_name == "abs_min":
            return np.abs(v).min(axis=1)
    raise KeyError(op_name)


def _combine(op_name: str, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return row_reduce(op_name, np.stack([a, b], axis=1))


def registers(engine: str) -> np.ndarray:
    """The (pmax,) fp32 registers of ``engine`` for the running program instance."""
    launch = context.current()
    bank = launch.__dict__.setdefault("accumulators", {})
    key = (engine, tuple(launch.program_id))
    if key not in bank:
        bank[key] = np.full(launch.target.pmax, np.nan, dtype=np.float32)
    return bank[key]


def update(engine: str, cmd, op_name, values: np.ndarray, init=None, read=False):
    """Apply ``cmd`` with this instruction's fp32 ``values`` [P, F]; return the registers [P, 1]
    after the update (when ``read``), else None. ``init``: [P, 1] values for ``load_reduce``."""
    cmd = cmd_enum(cmd)
    regs = registers(engine)
    parts = values.shape[0]
    if cmd == cmd_enum.idle and op_name is not None and read:
        cmd = cmd_enum.reset_reduce
    if cmd == cmd_enum.reset:
        regs[:parts] = IDENTITY[op_name or "add"]
    elif cmd != cmd_enum.idle:
        if cmd == cmd_enum.reset_reduce:
            start = np.full(parts, IDENTITY[op_name], np.float32)
        elif cmd == cmd_enum.load_reduce:
            start = np.asarray(init, np.float32).reshape(parts)
        else:
            start = regs[:parts]
        regs[:parts] = _combine(op_name, start, row_reduce(op_name, values))
    return regs[:parts].reshape(parts, 1).copy() if read else None
