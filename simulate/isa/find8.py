"""VectorE top-8 helpers: ``nc_find_index8`` and ``nc_match_replace8`` (``max8`` is in reduce.py).

``nc_find_index8``: per partition, the index of the first occurrence of each of 8 values in
``data`` (duplicated values take successive occurrences, ascending); a value not found gives the
all-ones sentinel of the uint16/uint32 dst. ``nc_match_replace8``: the same matching, with vals
processed from slot 7 down to 0 (so duplicates pair with occurrences in descending slot order);
each matched element of ``data`` becomes ``imm`` in ``dst``; ``dst_idx`` gets the indices.
"""

from __future__ import annotations

import numpy as np

from .. import dtypes
from .core import as_2d, fail, free_elems, on_chip, record, same_partitions
from .elementwise import store
from .reduce import top8_source_size

INDEX_TYPES = (dtypes.uint32, dtypes.uint16)


def _operands(o, data, vals):
    x, v = on_chip(data, o, "data"), on_chip(vals, o, "vals")
    parts = same_partitions(o, data=x, vals=v)
    n = top8_source_size(o, x, "data")
    if free_elems(v) != 8:
        fail(f"vals holds {free_elems(v)} elements per partition, must be 8", o, "vals")
    return x, v, parts, n


def _match(data, vals, order):
    """Indices [P, 8] of the occurrence each slot (visited in ``order``) claims, or -1."""
    parts = data.shape[0]
    idx = np.full((parts, 8), -1, np.int64)
    for p in range(parts):
        taken = np.zeros(data.shape[1], bool)
        for s in order:
            hits = np.flatnonzero((data[p] == vals[p, s]) & ~taken)
            if hits.size:
                idx[p, s] = hits[0]
                taken[hits[0]] = True
    return idx


def _index_dst(o, dst, role, parts):
    d = on_chip(dst, o, role)
    if dst.dtype not in INDEX_TYPES:
        fail(f"{role} dtype {dst.dtype.name} must be uint32 or uint16", o, role)
    if d.shape[0] != parts or free_elems(d) != 8:
        fail(f"{role} {dst.shape} must be [{parts}, 8]", o, role)
    return d


def _store_index(d, idx):
    sentinel = np.iinfo(d.tensor.dtype).max
    d.write(np.where(idx < 0, sentinel, idx).astype(d.tensor.dtype).reshape(d.shape))


def nc_find_index8(dst, data, vals, name=None):
    o = "nc_find_index8"
    x, v, parts, n = _operands(o, data, vals)
    d = _index_dst(o, dst, "dst", parts)
    idx = _match(as_2d(x.read()).astype(np.float32), as_2d(v.read()).astype(np.float32), range(8))
    _store_index(d, idx)
    return record(o, "vector", {"dst": d, "data": x, "vals": v}, name=name, partitions=parts,
                  free_elems=n)


def nc_match_replace8(dst, data, vals, imm, dst_idx=None, name=None):
    o = "nc_match_replace8"
    x, v, parts, n = _operands(o, data, vals)
    d = on_chip(dst, o, "dst")
    same_partitions(o, dst=d, data=x)
    if free_elems(d) != n:
        fail(f"dst holds {free_elems(d)} elements per partition, data {n}", o, "dst")
    values = as_2d(x.read()).astype(np.float32)
    idx = _match(values, as_2d(v.read()).astype(np.float32), range(7, -1, -1))
    out = values.copy()
    rows, slots = np.nonzero(idx >= 0)
    out[rows, idx[rows, slots]] = np.float32(imm)
    store(d, out)
    operands = {"dst": d, "data": x, "vals": v}
    if dst_idx is not None:
        di = _index_dst(o, dst_idx, "dst_idx", parts)
        _store_index(di, idx)
        operands["dst_idx"] = di
    return record(o, "vector", operands, name=name, partitions=parts, free_elems=n)
