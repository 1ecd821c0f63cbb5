"""GpSimd data movement inside SBUF: ``nc_n_gather``, ``local_gather``, ``sequence_bounds``, ``topk``.

Semantics follow the NKI ISA reference and its NumPy examples:
- ``nc_n_gather``: per partition, ``dst[p, j] = data[p].ravel()[indices[p, j]]`` (uint32 indices,
  in range, or an ``OutOfBoundsError``).
- ``local_gather``: each GpSimd core (16 partitions) flattens its slice of ``index`` partition
  first (column-major) and keeps ``num_valid_indices``; every partition p of the core then takes
  ``num_elem_per_idx`` contiguous elements of ``src_buffer[p]`` at each index (element units).
- ``sequence_bounds``: [start, end) of the segment of each element of ``segment_ids`` (one
  partition); segment id 0 is padding (start n, end -1).
- ``topk``: per partition, the K largest of the first n elements of a 16-partition "snake" (element
  e at partition e % 16 of column e // 16 of the core's slice) in ascending order, with indices.
"""

from __future__ import annotations

import numpy as np

from .. import context, dtypes
from ..errors import OutOfBoundsError, TargetError
from .core import as_2d, fail, free_elems, on_chip, record, same_partitions

GROUP = 16                       # partitions per GpSimd core
ELEMS_PER_INDEX = (1, 2, 4, 8, 16, 32)


def _sbuf(t, o, role):
    return on_chip(t, o, role, ("sbuf",))


def nc_n_gather(dst, data, indices, name=None):
    """``dst[p, j] = data[p].ravel()[indices[p, j]]`` for every partition p."""
    o = "nc_n_gather"
    d, x, i = _sbuf(dst, o, "dst"), _sbuf(data, o, "data"), _sbuf(indices, o, "indices")
    parts = same_partitions(o, dst=d, data=x, indices=i)
    if dst.dtype != data.dtype:
        fail(f"dst dtype {dst.dtype.name} must equal data's {data.dtype.name}", o, "dst")
    if indices.dtype != dtypes.uint32:
        fail(f"indices dtype {indices.dtype.name} must be uint32", o, "indices")
    if free_elems(d) != free_elems(i):
        fail(f"dst holds {free_elems(d)} elements per partition, indices {free_elems(i)}", o,
             "dst")
    n = free_elems(x)
    idx = as_2d(i.read()).astype(np.int64)
    bad = np.argwhere(idx >= n)
    if bad.size:
        p, j = bad[0]
        context.fail(OutOfBoundsError, f"indices[{p}, {j}] = {idx[p, j]} is outside the {n} "
                     f"elements of a data partition", op=o, operand="indices")
    values = as_2d(x.read())
    d.write(np.take_along_axis(values, idx, axis=1).reshape(d.shape))
    return record(o, "gpsimd", {"dst": d, "data": x, "indices": i}, name=name, partitions=parts,
                  free_elems=free_elems(i))


def local_gather(dst, src_buffer, index, num_elem_per_idx=1, num_valid_indices=None, name=None):
    """Per GpSimd core: gather ``num_elem_per_idx`` contiguous elements at each of its indices."""
    o = "local_gather"
    d = _sbuf(dst, o, "dst")
    s, i = _sbuf(src_buffer, o, "src_buffer"), _sbuf(index, o, "index")
    parts = same_partitions(o, dst=d, src_buffer=s, index=i)
    if parts % GROUP:
        fail(f"partition count {parts} must be a multiple of {GROUP}", o, "src_buffer")
    if index.dtype != dtypes.uint16:
        fail(f"index dtype {index.dtype.name} must be uint16", o, "index")
    if dst.dtype != src_buffer.dtype:
        fail(f"dst dtype {dst.dtype.name} must equal src_buffer's {src_buffer.dtype.name} (no "
             f"casting)", o, "dst")
    if num_elem_per_idx not in ELEMS_PER_INDEX:
        fail(f"num_elem_per_idx={num_elem_per_idx!r} must be one of {ELEMS_PER_INDEX}", o,
             "num_elem_per_idx")
    per_core = GROUP * free_elems(i)
    valid = per_core if num_valid_indices is None else int(num_valid_indices)
    if not 1 <= valid <= min(per_core, 4096):
        fail(f"num_valid_indices={num_valid_indices!r} must be in [1, {min(per_core, 4096)}] "
             f"(the indices of one core's 16 partitions, at most 4096)", o, "num_valid_indices")
    k = int(num_elem_per_idx)
    if free_elems(d) != valid * k:
        fail(f"dst holds {free_elems(d)} elements per partition; {valid} indices x "
             f"{k} elements need {valid * k}", o, "dst")
    src, idx = as_2d(s.read()), as_2d(i.read()).astype(np.int64)
    n = src.shape[1]
    out = np.empty((parts, valid * k), src.dtype)
    for c in range(0, parts, GROUP):
        flat = idx[c:c + GROUP].ravel(order="F")[:valid]
        if (flat + k > n).any():
            bad = int(flat[flat + k > n][0])
            context.fail(OutOfBoundsError, f"index {bad} + {k} elements is past the {n} elements "
                         f"of a src_buffer partition (core of partitions {c}..{c + GROUP - 1})",
                         op=o, operand="index")
        cols = (flat[:, None] + np.arange(k)).ravel()
        out[c:c + GROUP] = src[c:c + GROUP][:, cols]
    d.write(out.reshape(d.shape))
    return record(o, "gpsimd", {"dst": d, "src_buffer": s, "index": i}, name=name,
                  partitions=parts, free_elems=valid * k)


def segment_bounds(ids: np.ndarray) -> np.ndarray:
    """[2, n] start and end of each element's segment in one row of segment ids (0 = padding)."""
    n = ids.size
    start, end = np.empty(n, np.int64), np.empty(n, np.int64)
    for j in range(n):
        start[j] = n if ids[j] == 0 else (start[j - 1] if j and ids[j] == ids[j - 1] else j)
    for j in range(n - 1, -1, -1):
        end[j] = -1 if ids[j] == 0 else (end[j + 1] if j < n - 1 and ids[j] == ids[j + 1]
                                          else j + 1)
    return np.stack([start, end])


def sequence_bounds(dst, segment_ids, name=None):
    """dst [1, 2, n] = (start, end) of the segment of each element of segment_ids [1, n]."""
    o = "sequence_bounds"
    d, s = _sbuf(dst, o, "dst"), _sbuf(segment_ids, o, "segment_ids")
    if segment_ids.shape[0] != 1 or dst.shape[0] != 1:
        fail("the partition dimension must be 1", o, "segment_ids")
    for role, t in (("dst", dst), ("segment_ids", segment_ids)):
        if t.dtype not in (dtypes.float32, dtypes.int32):
            fail(f"{role} dtype {t.dtype.name} must be float32 or int32", o, role)
    n = free_elems(s)
    if free_elems(d) != 2 * n:
        fail(f"dst holds {free_elems(d)} elements, must be 2 x {n} ([1, 2, {n}])", o, "dst")
    ids = as_2d(s.read())[0]
    if (ids < 0).any():
        fail("segment ids must be non-negative", o, "segment_ids")
    d.write(dtypes.cast(segment_bounds(ids), dst.dtype).reshape(d.shape))
    return record(o, "gpsimd", {"dst": d, "segment_ids": s}, name=name, partitions=1,
                  free_elems=n)


def topk(val_dst, idx_dst, src, n, name=None):
    """K largest of each partition's n-element snake, ascending, with their indices."""
    o = "topk"
    target = context.current().target
    if target.nc_version < 3:
        context.fail(TargetError, f"{o} needs NeuronCore-v3+ (target {target.name})", op=o)
    v, i, s = _sbuf(val_dst, o, "val_dst"), _sbuf(idx_dst, o, "idx_dst"), _sbuf(src, o, "src")
    parts = same_partitions(o, val_dst=v, idx_dst=i, src=s)
    if parts % GROUP:
        fail(f"partition count {parts} must be a multiple of {GROUP}", o, "src")
    for role, t, want in (("src", src, dtypes.bfloat16), ("val_dst", val_dst, dtypes.bfloat16),
                          ("idx_dst", idx_dst, dtypes.uint32)):
        if t.dtype != want:
            fail(f"{role} dtype {t.dtype.name} must be {want.name}", o, role)
    k = free_elems(v)
    if free_elems(i) != k:
        fail(f"idx_dst holds {free_elems(i)} elements per partition, val_dst {k}", o, "idx_dst")
    cols = free_elems(s)
    if not isinstance(n, (int, np.integer)) or not 8 <= n < 65536 or -(-n // GROUP) > cols:
        fail(f"n={n!r} must be in [8, 65536) and fit the {cols} columns of src (n <= "
             f"{cols * GROUP})", o, "n")
    if not 1 <= k <= n or k >= 32768:
        fail(f"K = {k} (val_dst's free size) must be in [1, min(n, 32767)]", o, "val_dst")
    values = as_2d(s.read()).astype(np.float32)
    vals = np.empty((parts, k), np.float32)
    idxs = np.empty((parts, k), np.int64)
    for c in range(0, parts, GROUP):
        snake = values[c:c + GROUP].ravel(order="F")[:n]      # element e at (e % 16, e // 16)
        top = np.argsort(-snake, kind="stable")[:k][::-1]       # K largest, ascending
        vals[c:c + GROUP], idxs[c:c + GROUP] = snake[top], top
    v.write(dtypes.cast(vals, dtypes.bfloat16).reshape(v.shape))
    i.write(idxs.astype(np.uint32).reshape(i.shape))
    return record(o, "gpsimd", {"val_dst": v, "idx_dst": i, "src": s}, name=name,
                  partitions=parts, free_elems=4 * n + k)
