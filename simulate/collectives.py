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

import numpy as np

from . import context
from .collectives_common import (ReplicaGroup, _check_shape, _combine, _exchange,  # noqa: F401
                                 _fail, _group, _record, _reduce_op, _resolve_all, _signature,
                                 _split_part, _values, rank_id)


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


# the collectives with sizes read at run time, and the ring permutes (their own modules, on the
# same helpers)
from .collectives_v import all_gather_v, all_to_all_v  # noqa: E402
from .collectives_ring import (collective_permute_implicit,  # noqa: E402
                               collective_permute_implicit_current_processing_rank_id,
                               collective_permute_implicit_reduce)

__all__ = ["ReplicaGroup", "rank_id", "all_reduce", "all_gather", "reduce_scatter", "all_to_all",
           "collective_permute", "all_gather_v", "all_to_all_v", "collective_permute_implicit",
           "collective_permute_implicit_reduce",
           "collective_permute_implicit_current_processing_rank_id"]
