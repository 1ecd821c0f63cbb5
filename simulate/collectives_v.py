"""``nki.collectives.all_gather_v`` / ``all_to_all_v``: collectives whose per-rank sizes are
device data, read from a ``uint32`` metadata tensor when the collective runs.

Both treat ``srcs[0]`` and ``dsts[0]`` (one HBM tensor each) as flat element buffers. The
metadata tensor is ``(rows, n)`` on HBM or ``(1, rows, n)`` in SBUF, n = the rank-list size,
column j about the j-th rank of the caller's rank-list:

- row 0 ``send_counts``, row 1 ``send_displs`` (inputs): all_to_all_v sends
  ``src[send_displs[j]:][:send_counts[j]]`` to rank j; all_gather_v reads column 0 only and sends
  that one chunk to every rank.
- row 2 ``recv_counts``: written with the element count received from each rank, unless
  ``recv_counts_known=True`` (then untouched); never read.
- row 3 ``recv_displs`` (input, only with ``has_rdispls=True``): where rank j's chunk lands in
  dst; without it, dst is cut into n equal slots and rank j's chunk starts slot j.

Checked when the collective runs, as the hardware validates them (each a ``ValidationError``
naming the operand): metadata dtype and shape, a chunk inside its src, a chunk inside its slot
(or inside dst, with ``has_rdispls``), chunks landing on overlapping elements of one dst. Parts of
dst no chunk lands on keep their values.
"""

from __future__ import annotations

import numpy as np

from . import context
from .collectives_common import _exchange, _fail, _group, _record, _resolve_all


def _metadata(op, metadata_tensor, n, has_rdispls):
    """(resolved metadata, its [rows, n] int64 values)."""
    from .access import resolve
    r = resolve(metadata_tensor, op, "metadata_tensor")
    if r.tensor.dtype.name != "uint32":
        _fail(op, f"metadata_tensor must be uint32, got {r.tensor.dtype.name}", "metadata_tensor")
    shape = tuple(r.shape)
    rows = shape[1] if r.buffer == "sbuf" else shape[0]
    want = (4,) if has_rdispls else (3, 4)
    sbuf_ok = r.buffer != "sbuf" or (len(shape) == 3 and shape[0] == 1)
    if len(shape) != (3 if r.buffer == "sbuf" else 2) or not sbuf_ok or rows not in want \
            or shape[-1] != n:
        form = "(1, rows, n) in SBUF" if r.buffer == "sbuf" else "(rows, n) on HBM"
        _fail(op, f"metadata_tensor has shape {shape}; it must be {form} with rows "
                  f"{' or '.join(map(str, want))} (has_rdispls={has_rdispls}) and n = {n} (the "
                  f"rank-list size)", "metadata_tensor")
    return r, r.read().reshape(rows, n).astype(np.int64)


def _chunk(op, flat, count, displ, what):
    if displ + count > flat.size:
        _fail(op, f"{what}: elements [{displ}, {displ + count}) are outside srcs[0] "
                  f"({flat.size} elements)", "metadata_tensor")
    return flat[displ:displ + count].copy()


def _land(op, dst, chunks, group, meta, has_rdispls):
    """Write each sender's chunk (``chunks``: by rank) into ``dst``; return the counts, in
    rank-list order."""
    flat = dst.read().reshape(-1).copy()
    n = len(group)
    if not has_rdispls and flat.size % n:
        _fail(op, f"dsts[0] has {flat.size} elements, not a multiple of the rank-list size {n}: "
                  f"it cannot be cut into equal slots", "dsts[0]")
    slot = flat.size // n
    owner = np.full(flat.size, -1, np.int64)
    counts = []
    for j, sender in enumerate(group):
        chunk = chunks[sender]
        start, end = (int(meta[3, j]), flat.size) if has_rdispls else (j * slot, (j + 1) * slot)
        if start + chunk.size > end:
            where = (f"recv_displs[{j}] = {start}" if has_rdispls
                     else f"its slot [{j * slot}, {(j + 1) * slot})")
            _fail(op, f"rank {sender} sends {chunk.size} elements, which do not fit at {where} "
                      f"of dsts[0] ({flat.size} elements)", "metadata_tensor")
        clash = owner[start:start + chunk.size]
        if np.any(clash >= 0):
            _fail(op, f"the chunks of ranks {group[int(clash[clash >= 0][0])]} and {sender} "
                      f"overlap in dsts[0] (recv_displs)", "metadata_tensor")
        owner[start:start + chunk.size] = j
        flat[start:start + chunk.size] = chunk
        counts.append(chunk.size)
    dst.write(flat.reshape(dst.shape))
    return counts


def _record_counts(meta_r, meta, counts, recv_counts_known):
    if not recv_counts_known:
        out = meta.copy()
        out[2, :] = counts
        meta_r.write(out.astype(np.uint32).reshape(meta_r.shape))


def _prepare(op, srcs, dsts, replica_group, metadata_tensor, has_rdispls):
    group = _group(op, replica_group)
    rs, rd, _ = _resolve_all(op, srcs, dsts, hbm_only=True, single=True)
    meta_r, meta = _metadata(op, metadata_tensor, len(group), bool(has_rdispls))
    return group, rs[0], rd[0], meta_r, meta


def all_gather_v(srcs, dsts, replica_group, metadata_tensor, recv_counts_known=False,
                 has_rdispls=False, priority=None, name=None):
    """Every rank broadcasts ``src[send_displs[0]:][:send_counts[0]]`` to its rank-list; rank
    j's chunk lands in slot j of every dst (or at ``recv_displs[j]``)."""
    me = "all_gather_v"
    group, s, d, meta_r, meta = _prepare(me, srcs, dsts, replica_group, metadata_tensor,
                                         has_rdispls)
    chunk = _chunk(me, s.read().reshape(-1), int(meta[0, 0]), int(meta[1, 0]),
                   f"send_counts[0] = {meta[0, 0]} from send_displs[0] = {meta[1, 0]}")
    got = _exchange(me, group, ((tuple(group), s.tensor.dtype.name, bool(has_rdispls)), chunk))
    counts = _land(me, d, got, group, meta, bool(has_rdispls))
    _record_counts(meta_r, meta, counts, recv_counts_known)
    return _record(me, [s], [d], name)


def all_to_all_v(srcs, dsts, replica_group, metadata_tensor, recv_counts_known=False,
                 has_rdispls=False, priority=None, name=None):
    """Rank i sends ``src[send_displs[j]:][:send_counts[j]]`` to the j-th rank of its
    rank-list, which writes it in slot i of its dst (or at its ``recv_displs[i]``)."""
    me = "all_to_all_v"
    group, s, d, meta_r, meta = _prepare(me, srcs, dsts, replica_group, metadata_tensor,
                                         has_rdispls)
    flat = s.read().reshape(-1)
    out = [_chunk(me, flat, int(meta[0, j]), int(meta[1, j]),
                  f"send_counts[{j}] = {meta[0, j]} from send_displs[{j}] = {meta[1, j]}")
           for j in range(len(group))]
    got = _exchange(me, group, ((tuple(group), s.tensor.dtype.name, bool(has_rdispls)), out))
    mine = group.index(context.current().rank)
    counts = _land(me, d, {r: got[r][mine] for r in group}, group, meta, bool(has_rdispls))
    _record_counts(meta_r, meta, counts, recv_counts_known)
    return _record(me, [s], [d], name)
