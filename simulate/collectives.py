"""``nki.collectives``: replica groups and collective operations across ranks.

A rank is one device program (a NeuronCore or an LNC=2 pair) in a multi-rank job. The simulator
runs the ranks of ``simulate.simulate(kernel, ranks=N)`` concurrently, one thread each, and a
collective completes when every rank of the caller's replica group has reached it (the k-th
collective of a rank on a group meets the k-th of every other rank of that group). A single-rank
launch is a job of one rank.

Documented rules enforced: tensors all on HBM or all in SBUF; several tensors per call (coalesced)
only on HBM; ``op`` one of ``nl.add``, ``nl.minimum``, ``nl.maximum``; ``collective_dim`` 0 (all-
gather in SBUF also 1, on 2-D tensors); all-to-all and collective_permute on HBM only,
collective_permute with one tensor. Every rank of a group must pass the same group, shapes and
dtypes. Reductions are computed in fp32 (exact for integers) in group order and cast to the dst
dtype.
"""

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


def all_reduce(srcs, dsts, replica_group, op, priority=None, name=None):
    """Every rank of the group gets, in each dst, the reduction (``op``) of that src over the
    group's ranks."""
    me = "all_reduce"
    group = _group(me, replica_group)
    rs, rd, _ = _resolve_all(me, srcs, dsts)
    how = _reduce_op(me, op)
    for i, (s, d) in enumerate(zip(rs, rd)):
        _check_shape(me, f"dsts[{i}]", d.shape, s.shape)
    got = _exchange(me, group, (_signature(group, rs, (how,)), _values(rs)))
    for i, d in enumerate(rd):
        d.write(_combine([got[r][i] for r in group], how, d.tensor.dtype).reshape(d.shape))
    return _record(me, rs, rd, name)


def _dim(op, collective_dim, place, rs, allowed_sbuf=(0,)):
    dim = int(collective_dim)
    allowed = allowed_sbuf if place == "sbuf" else (0,)
    if dim not in allowed:
        _fail(op, f"collective_dim={collective_dim} must be one of {allowed} for {place.upper()} "
                  f"tensors", "collective_dim")
    if place == "sbuf" and any(len(r.shape) != 2 for r in rs):
        _fail(op, "SBUF collectives take 2-D tensors (one free dim)", "srcs")
    return dim


def all_gather(srcs, dsts, replica_group, collective_dim, priority=None, name=None):
    """Each dst is the group's srcs concatenated along ``collective_dim``, in group order."""
    me = "all_gather"
    group = _group(me, replica_group)
    rs, rd, place = _resolve_all(me, srcs, dsts)
    dim = _dim(me, collective_dim, place, rs, allowed_sbuf=(0, 1))
    for i, (s, d) in enumerate(zip(rs, rd)):
        want = list(s.shape)
        want[dim] *= len(group)
        _check_shape(me, f"dsts[{i}]", d.shape, want)
    got = _exchange(me, group, (_signature(group, rs, (dim,)), _values(rs)))
    for i, (s, d) in enumerate(zip(rs, rd)):
        parts = [got[r][i].reshape(s.shape) for r in group]
        d.write(np.concatenate(parts, axis=dim).reshape(d.shape))
    return _record(me, rs, rd, name)


def reduce_scatter(srcs, dsts, replica_group, collective_dim, op, priority=None, name=None):
    """The group's srcs are reduced (``op``) and split along dim 0 into group-size parts; the
    k-th rank of the group gets part k."""
    me = "reduce_scatter"
    group = _group(me, replica_group)
    rs, rd, _ = _resolve_all(me, srcs, dsts)
    if int(collective_dim) != 0:
        _fail(me, f"collective_dim={collective_dim}: only 0 is supported", "collective_dim")
    how = _reduce_op(me, op)
    k = _split_part(me, rs, group)
    for i, (s, d) in enumerate(zip(rs, rd)):
        _check_shape(me, f"dsts[{i}]", d.shape, (s.shape[0] // len(group),) + tuple(s.shape[1:]))
    got = _exchange(me, group, (_signature(group, rs, (how,)), _values(rs)))
    for i, (s, d) in enumerate(zip(rs, rd)):
        total = _combine([got[r][i].reshape(s.shape) for r in group], how, d.tensor.dtype)
        d.write(np.split(total, len(group), axis=0)[k].reshape(d.shape))
    return _record(me, rs, rd, name)


def all_to_all(srcs, dsts, replica_group, collective_dim, priority=None, name=None):
    """Each src is split along dim 0 into group-size parts, part j going to the j-th rank of the
    group; each dst is the parts received, concatenated in group order (HBM only)."""
    me = "all_to_all"
    group = _group(me, replica_group)
    rs, rd, place = _resolve_all(me, srcs, dsts, hbm_only=True)
    _dim(me, collective_dim, place, rs)
    k = _split_part(me, rs, group)
    for i, (s, d) in enumerate(zip(rs, rd)):
        _check_shape(me, f"dsts[{i}]", d.shape, s.shape)
    got = _exchange(me, group, (_signature(group, rs), _values(rs)))
    for i, (s, d) in enumerate(zip(rs, rd)):
        parts = [np.split(got[r][i].reshape(s.shape), len(group), axis=0)[k] for r in group]
        d.write(np.concatenate(parts, axis=0).reshape(d.shape))
    return _record(me, rs, rd, name)


def collective_permute(srcs, dsts, source_target_pairs, priority=None, name=None):
    """Rank s sends its src to rank t's dst for each ``(s, t)`` pair (HBM, one tensor); a rank
    no pair targets keeps its dst."""
    me = "collective_permute"
    launch = context.current()
    rs, rd, _ = _resolve_all(me, srcs, dsts, hbm_only=True, single=True)
    pairs = [(int(a), int(b)) for a, b in source_target_pairs]
    targets = [t for _, t in pairs]
    if len(set(targets)) != len(targets) or len({s for s, _ in pairs}) != len(pairs):
        _fail(me, f"source_target_pairs={pairs}: each rank may send once and receive once",
              "source_target_pairs")
    ranks = sorted({r for pair in pairs for r in pair})
    _check_shape(me, "dsts[0]", rd[0].shape, rs[0].shape)
    if launch.rank not in ranks:                # neither sends nor receives
        return _record(me, rs, rd, name)
    _group(me, [ranks])
    got = _exchange(me, ranks, ((tuple(ranks), tuple(pairs), rs[0].shape,
                                 rs[0].tensor.dtype.name), _values(rs)))
    sources = [s for s, t in pairs if t == launch.rank]
    if sources:
        rd[0].write(got[sources[0]][0].reshape(rd[0].shape))
    return _record(me, rs, rd, name)


# the collectives with sizes read at run time, and the ring permutes (their own modules; they use
# the helpers above)
from .collectives_v import all_gather_v, all_to_all_v  # noqa: E402
from .collectives_ring import (collective_permute_implicit,  # noqa: E402
                               collective_permute_implicit_current_processing_rank_id,
                               collective_permute_implicit_reduce)

__all__ = ["ReplicaGroup", "rank_id", "all_reduce", "all_gather", "reduce_scatter", "all_to_all",
           "collective_permute", "all_gather_v", "all_to_all_v", "collective_permute_implicit",
           "collective_permute_implicit_reduce",
           "collective_permute_implicit_current_processing_rank_id"]
