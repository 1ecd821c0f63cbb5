"""What every instruction shares: operand checks, the trace event, the returned handle."""

from __future__ import annotations

import math

import numpy as np

from nki_kernels import access_patterns as aps

from .. import context
from ..access import Resolved, resolve
from ..errors import ValidationError
from ..trace import Operand
from .enums import ENGINE_NAMES, engine as engine_enum


class Instruction:
    """Handle returned by every ``nisa`` call (``NkiInstruction`` in NKI)."""

    def __init__(self, event, loops=(), order=0):
        self.event = event
        self.loops = loops          # the device loops (LoopFrame) around it, outermost first
        self.order = order          # issue order within the launch instance

    def depends_on(self, *producers, kind=None) -> "Instruction":
        """Run this instruction after each producer (``kind``: ``dependency.runtime``, a
        semaphore wait, or ``dependency.schedule``, issue order only; None: the older form).

        As on the device, an edge may not leave a device loop: each producer sits at the same
        loop nesting as this instruction or in an enclosing scope. The simulator runs in program
        order, so a producer must also be issued before its consumer. The edge is recorded in
        the trace (``details["after"]``) for the cost model."""
        from .enums import dependency
        if kind is not None and not isinstance(kind, dependency):
            fail(f"kind={kind!r} must be nki.isa.dependency.runtime or .schedule", "depends_on",
                 "kind")
        for p in producers:
            if not isinstance(p, Instruction):
                fail(f"producer {p!r} is not an instruction handle (the value a nisa call "
                     f"returns)", "depends_on", "producers")
            if self.loops[:len(p.loops)] != p.loops or len(p.loops) > len(self.loops):
                fail("the producer is inside a device loop (fori_loop / while_loop / "
                     "dynamic_range) the consumer is not in: a dependency edge cannot leave a "
                     "dynamic loop (its semaphore would fire unconditionally or never)",
                     "depends_on", "producers")
            if p.order > self.order:
                fail("the producer was issued after this instruction; the simulator runs in "
                     "program order, so issue the producer first", "depends_on", "producers")
            if self.event is not None and p.event is not None:
                edges = self.event.details.setdefault("after", [])
                edges.append((p.event.index, "schedule" if kind == dependency.schedule
                              else "runtime"))
        return self


def fail(message: str, op: str, operand: str = None, cls=ValidationError):
    context.fail(cls, message, op=op, operand=operand)


def engine_name(requested, default: str, allowed, op: str) -> str:
    """The engine an instruction runs on: ``requested`` (nisa.engine) if allowed, else ``default``."""
    if requested is None or requested == engine_enum.unknown:
        return default
    name = ENGINE_NAMES.get(engine_enum(requested))
    if name not in allowed:
        fail(f"engine={name} is not one of {allowed}", op, "engine")
    return name


# MX scale tiles may start at partition 0, 4, 8 or 12 (one quadrant's scales packed beside
# another tensor's: the SDK's mxfp-matmul deep dive, "Packing Scale Values")
MX_SCALE_STARTS = (0, 4, 8, 12)


def on_chip(t, op: str, role: str, buffers=("sbuf", "psum"), mx_scale=False) -> Resolved:
    """Resolve a compute-engine operand: on chip, <= pmax partitions, legal start partition
    (``mx_scale``: an MX scale view, which may also start at 4, 8 or 12)."""
    r = resolve(t, op, role)
    if r.buffer not in buffers:
        fail(f"operand is in {r.buffer}; this instruction accepts {' or '.join(buffers)}", op, role)
    if t._dynamic is not None:
        fail("dynamic offsets are for DMA instructions only", op, role)
    target = context.current().target
    parts = t.shape[0]
    if parts > target.pmax:
        fail(f"partition dimension {parts} exceeds maximum {target.pmax}", op, role)
    free = aps.free_size(t._storage.shape)
    free = aps.reinterpret_count(free, t._storage.dtype, t.dtype)
    start = t.offset // free if free else 0
    legal = (0,) if parts > 64 else (0, 64) if parts > 32 else (0, 32, 64, 96)
    if mx_scale:
        legal = tuple(sorted(set(legal) | set(MX_SCALE_STARTS)))
    if start not in legal:
        fail(f"access of {parts} partitions starts at partition {start}; compute engines "
             f"start such an access at partition {' or '.join(map(str, legal))}", op, role)
    if t.strides[0] != free and parts > 1:
        fail(f"partition stride {t.strides[0]} != free size {free}: partitions must be "
             f"contiguous", op, role)
    return r


def as_2d(values: np.ndarray) -> np.ndarray:
    """(P, free elements) view of an on-chip operand's values."""
    return values.reshape(values.shape[0], -1)


def same_partitions(op: str, **operands: Resolved) -> int:
    parts = {role: r.shape[0] for role, r in operands.items()}
    if len(set(parts.values())) != 1:
        fail(f"partition counts differ: {parts}", op)
    return next(iter(parts.values()))


def free_elems(r: Resolved) -> int:
    return math.prod(r.shape[1:])


_DTYPE_NAMES = {}                      # np.dtype -> name (NumPy computes .name on every read)


def describe(role: str, r: Resolved) -> Operand:
    t = r.tensor
    name = _DTYPE_NAMES.get(t._dtype)
    if name is None:
        name = _DTYPE_NAMES[t._dtype] = t._dtype.name
    operand = object.__new__(Operand)         # the frozen dataclass's fields, set directly (hot)
    operand.__dict__.update(role=role, tensor=t.name, buffer=r.buffer, dtype=name,
                            shape=t._shape, pattern=tuple(zip(t._strides, t._shape)),
                            offset=r.offset, indirect=r.indirect, storage=t._storage.ident,
                            row_bytes=t._storage.row_bytes, address=t._storage.address)
    return operand


def _offset_tables(operands: dict):
    """The on-chip tensors holding the dynamic offsets of ``operands`` (read by the instruction,
    or by its DMA descriptor generation), as ``<role>_offsets`` operands after the others."""
    for role, r in operands.items():
        dyn = r.tensor._dynamic
        if dyn is not None and hasattr(dyn.source, "_storage"):
            yield describe(f"{role}_offsets", Resolved(dyn.source, dyn.source.offset))


def record(op: str, engine: str, operands: dict, name=None, **fields) -> Instruction:
    """Append an event to the current trace (if any) and return the instruction handle."""
    launch = context.current()
    for r in operands.values():          # liveness: this instruction touches these tiles
        context.touch(r.tensor, launch.issued)
        dyn = r.tensor._dynamic
        if dyn is not None and hasattr(dyn.source, "_storage"):
            context.touch(dyn.source, launch.issued)
    event = None
    if launch.trace is not None:
        depth, first_pass = launch.loop_position()
        described = tuple(describe(k, v) for k, v in operands.items())
        described += tuple(_offset_tables(operands))
        event = launch.trace.add(op=op, engine=engine, program_id=launch.program_id,
                                 operands=described, name=name, loop_depth=depth,
                                 first_pass=first_pass, **fields)
    launch.issued += 1
    return Instruction(event, tuple(launch.loop_frames), launch.issued)
