"""``nki.collectives`` ring permutes: each rank sends to its successor in its rank-list and
receives from its predecessor, the ring being the rank-list's order (the last rank's successor is
the first).

- ``collective_permute_implicit``: per channel c, ``srcs_by_channel[c][0]`` goes to the
  successor's ``dsts_by_channel[c][0]``.
- ``collective_permute_implicit_reduce``: per channel, ``op(srcs0, srcs1)`` (computed in fp32,
  exact for integers, cast to the dst dtype) goes to the successor.
- ``collective_permute_implicit_current_processing_rank_id(i, group)``: a register holding the
  rank whose data a rank holds after i ring steps: its own at 0, its predecessor's at 1, and so
  on around the ring.

Rules enforced: one tensor per channel list; ``channel_ids`` consecutive from 0, one per channel,
at most 4 (the documented maximum, for rank-lists spanning a node's devices); a dst of its src's
shape and dtype; tensors all on HBM or all in SBUF. Every channel uses the same ring direction
(the documentation names no other).
"""

from __future__ import annotations

from . import context
from .collectives_common import _combine, _exchange, _fail, _group, _record, _reduce_op, _resolve_all
from .collectives_common import _check_shape
from .registers import NkiScalar, VirtualRegister

MAX_CHANNELS = 4


def _channels(op, lists, names, channel_ids):
    """Per channel, the one tensor of each of ``lists``; checks the channel ids."""
    counts = {len(x) for x in lists}
    if len(counts) != 1 or 0 in counts:
        _fail(op, f"{', '.join(names)} must list the same, non-zero number of channels, got "
                  f"{[len(x) for x in lists]}", names[-1])
    n = counts.pop()
    ids = list(channel_ids)
    if ids != list(range(len(ids))) or len(ids) != n or n > MAX_CHANNELS:
        _fail(op, f"channel_ids={ids} must be 0, 1, .., one per channel ({n}), at most "
                  f"{MAX_CHANNELS}", "channel_ids")
    for name, lst in zip(names, lists):
        for c, inner in enumerate(lst):
            if len(inner) != 1:
                _fail(op, f"{name}[{c}] must hold exactly one tensor (coalesced communication "
                          f"is not supported), got {len(inner)}", f"{name}[{c}]")
    return [[lst[c][0] for lst in lists] for c in range(n)]


def _ring(op, replica_group):
    """(rank-list, this rank's position in it, its predecessor)."""
    group = _group(op, replica_group)
    k = group.index(context.current().rank)
    return group, k, group[(k - 1) % len(group)]


def _send(op, group, pred, payload, dsts, signature):
    got = _exchange(op, group, (signature, payload))
    for d, values in zip(dsts, got[pred]):
        d.write(values.reshape(d.shape))


def collective_permute_implicit(srcs_by_channel, dsts_by_channel, replica_group,
                                channel_ids=[0], priority=None, name=None):
    me = "collective_permute_implicit"
    group, _, pred = _ring(me, replica_group)
    per = _channels(me, [srcs_by_channel, dsts_by_channel],
                    ["srcs_by_channel", "dsts_by_channel"], channel_ids)
    rs, rd, _ = _resolve_all(me, [s for s, _ in per], [d for _, d in per])
    for c, (s, d) in enumerate(zip(rs, rd)):
        _check_shape(me, f"dsts_by_channel[{c}][0]", d.shape, s.shape)
    signature = (tuple(group), tuple((r.shape, r.tensor.dtype.name) for r in rs))
    _send(me, group, pred, [r.read().copy() for r in rs], rd, signature)
    return _record(me, rs, rd, name)


def collective_permute_implicit_reduce(srcs0_by_channel, srcs1_by_channel, dsts_by_channel,
                                       replica_group, op, channel_ids=[0], priority=None,
                                       name=None):
    me = "collective_permute_implicit_reduce"
    group, _, pred = _ring(me, replica_group)
    how = _reduce_op(me, op)
    per = _channels(me, [srcs0_by_channel, srcs1_by_channel, dsts_by_channel],
                    ["srcs0_by_channel", "srcs1_by_channel", "dsts_by_channel"], channel_ids)
    r0, rd, _ = _resolve_all(me, [a for a, _, _ in per], [d for _, _, d in per])
    r1, _, _ = _resolve_all(me, [b for _, b, _ in per], [d for _, _, d in per])
    payload = []
    for c, (a, b, d) in enumerate(zip(r0, r1, rd)):
        _check_shape(me, f"srcs1_by_channel[{c}][0]", b.shape, a.shape)
        _check_shape(me, f"dsts_by_channel[{c}][0]", d.shape, a.shape)
        payload.append(_combine([a.read(), b.read().reshape(a.shape)], how, d.tensor.dtype))
    signature = (tuple(group), how, tuple((r.shape, r.tensor.dtype.name) for r in r0))
    _send(me, group, pred, payload, rd, signature)
    return _record(me, r0 + r1, rd, name)


def collective_permute_implicit_current_processing_rank_id(iteration_id, replica_group,
                                                           channel_id=0, name=None):
    """A register: the rank whose data this rank holds after ``iteration_id`` ring steps (an
    int, a register or a scalar, e.g. a device loop's index)."""
    me = "collective_permute_implicit_current_processing_rank_id"
    group, k, _ = _ring(me, replica_group)
    if not 0 <= int(channel_id) < MAX_CHANNELS:
        _fail(me, f"channel_id={channel_id} must be in [0, {MAX_CHANNELS})", "channel_id")
    if isinstance(iteration_id, (VirtualRegister, NkiScalar)):
        step = iteration_id.read_value()
    elif isinstance(iteration_id, int) and not isinstance(iteration_id, bool):
        step = iteration_id
    else:
        _fail(me, f"iteration_id must be an int, a register or a scalar, got "
                  f"{type(iteration_id).__name__}", "iteration_id")
    if step < 0:
        _fail(me, f"iteration_id={step} must be >= 0", "iteration_id")
    return VirtualRegister(group[(k - step) % len(group)])
