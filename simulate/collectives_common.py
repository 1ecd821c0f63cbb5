"""What the collectives share: replica groups, rank ids, the rendezvous of a group and the
resolution, signature, combination and trace record of their operands (``collectives``,
``collectives_v`` and ``collectives_ring`` build on it)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import List

import numpy as np

from . import context, dtypes
from .errors import ValidationError
from .lnc import SynchronizationError
from .objects import NKIObject


@dataclass
class ReplicaGroup(NKIObject):
    """Groups of ranks taking part in a collective, e.g. ``ReplicaGroup([[0, 1], [2, 3]])``;
    sub-groups must not overlap."""

    replica_groups: List[List[int]] = field(default_factory=list)

    def __post_init__(self):
        seen = set()
        for group in self.replica_groups:
            for rank in group:
                if rank in seen:
                    raise ValueError(f"ReplicaGroup: rank {rank} is in more than one sub-group")
                seen.add(rank)

    def group_of(self, rank: int) -> List[int]:
        for group in self.replica_groups:
            if rank in group:
                return list(group)
        raise ValueError(f"rank {rank} is in no sub-group of {self.replica_groups}")


def rank_id(name=None) -> int:
    """This program's rank in the multi-rank launch (0 for a single-rank launch)."""
    return context.current().rank


REDUCE_OPS = ("add", "minimum", "maximum")


def _fail(op, message, operand=None, cls=ValidationError):
    context.fail(cls, message, op=op, operand=operand)


def _group(op, replica_group):
    launch = context.current()
    groups = (replica_group.replica_groups if isinstance(replica_group, ReplicaGroup)
              else replica_group)
    try:
        groups = [[int(r) for r in g] for g in groups]
    except TypeError:
        _fail(op, f"replica_group={replica_group!r} must be a ReplicaGroup or a list of rank "
                  f"lists", "replica_group")
    ranks = 1 if launch.job is None else len(launch.job.instances)
    bad = [r for g in groups for r in g if not 0 <= r < ranks]
    if bad:
        _fail(op, f"replica_group names rank {bad[0]}, but the job has {ranks} rank(s) (launch "
              f"with simulate(kernel, ranks=N))", "replica_group")
    try:                                     # sub-groups must not overlap; the caller's group
        return ReplicaGroup(groups).group_of(launch.rank)
    except ValueError as err:
        _fail(op, f"rank {launch.rank}: {err}", "replica_group")


def _resolve_all(op, srcs, dsts, hbm_only=False, single=False):
    from .access import resolve
    srcs, dsts = list(srcs), list(dsts)
    if len(srcs) != len(dsts) or not srcs:
        _fail(op, f"srcs and dsts must be non-empty lists of equal length, got {len(srcs)} and "
                  f"{len(dsts)}", "dsts")
    rs = [resolve(t, op, f"srcs[{i}]") for i, t in enumerate(srcs)]
    rd = [resolve(t, op, f"dsts[{i}]") for i, t in enumerate(dsts)]
    places = {"sbuf" if r.buffer == "sbuf" else "hbm" if "hbm" in r.buffer else r.buffer
              for r in rs + rd}
    if len(places) != 1 or places - {"sbuf", "hbm"}:
        _fail(op, f"tensors must all be on HBM or all in SBUF, got {sorted(places)}", "srcs")
    place = places.pop()
    if hbm_only and place != "hbm":
        _fail(op, "tensors must be on HBM (SBUF is not supported for this collective)", "srcs")
    if place == "sbuf" and len(rs) > 1:
        _fail(op, "several tensors per call (coalesced) are only supported on HBM", "srcs")
    if single and len(rs) > 1:
        _fail(op, "exactly one tensor per list is supported", "srcs")
    for i, (s, d) in enumerate(zip(rs, rd)):
        if s.tensor.dtype != d.tensor.dtype:
            _fail(op, f"srcs[{i}] {s.tensor.dtype.name} and dsts[{i}] {d.tensor.dtype.name} "
                      f"differ in dtype", f"dsts[{i}]")
    return rs, rd, place


def _reduce_op(op, token):
    name = getattr(token, "name", None)
    if name not in REDUCE_OPS:
        _fail(op, f"op={token!r} must be nl.add, nl.minimum or nl.maximum", "op")
    return name


def _exchange(op, group, payload):
    """Post this rank's payload; the payloads of every rank of ``group``, by rank."""
    launch = context.current()
    job, me = launch.job, launch.rank
    if job is None:
        return {me: payload}
    n = job.next_number(me, (op, tuple(group)))
    got = job.arrive((op, tuple(group), n), me, payload, list(group), op)
    signature = payload[0]
    for rank, (theirs, _) in got.items():
        if theirs != signature:
            _fail(op, f"rank {rank} passes {theirs}, rank {me} passes {signature}: every rank "
                      f"of a group must pass the same group, shapes and dtypes", "srcs",
                  SynchronizationError)
    return {rank: values for rank, (_, values) in got.items()}


def _values(rs):
    """This rank's payload: a copy of every src."""
    return [r.read().copy() for r in rs]


def _split_part(op, rs, group):
    """This rank's position in ``group``, after checking every src splits into group-size parts
    along dim 0."""
    for i, s in enumerate(rs):
        if s.shape[0] % len(group):
            _fail(op, f"srcs[{i}] dim 0 ({s.shape[0]}) must divide by the group size "
                      f"{len(group)}", f"srcs[{i}]")
    return group.index(context.current().rank)


def _signature(group, rs, extra=()):
    return (tuple(group), tuple((r.shape, r.tensor.dtype.name) for r in rs)) + tuple(extra)


def _combine(parts, how, dtype):
    if dtypes.is_int(dtype):
        stack = np.stack([p.astype(np.int64) for p in parts])
    else:
        stack = np.stack([p.astype(np.float32) for p in parts])
    fn = {"add": np.add, "minimum": np.minimum, "maximum": np.maximum}[how]
    out = stack[0]
    for p in stack[1:]:
        out = fn(out, p)
    return dtypes.cast(out, dtype)


def _record(op, rs, rd, name):
    from .isa.core import record
    operands = {f"src{i}": r for i, r in enumerate(rs)}
    operands.update({f"dst{i}": r for i, r in enumerate(rd)})
    moved = sum(math.prod(r.shape) * r.tensor.dtype.itemsize for r in rd)
    return record(op, "dma", operands, name=name, dma_bytes=moved)


def _check_shape(op, role, got, want):
    if tuple(got) != tuple(want):
        _fail(op, f"{role} has shape {tuple(got)}, expected {tuple(want)}", role)
