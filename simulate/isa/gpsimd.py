"""GpSimd instructions that work per GpSimd core: ``nonzero_with_count``.

Each of the eight GpSimd cores is wired to 16 contiguous SBUF partitions and, here, reads and
writes only its first one: partitions 0, 16, ..., 112 of the SBUF (other partitions of ``dst``,
and their extra count slot, are left as they were).
"""

from __future__ import annotations

import numpy as np

from .. import context, dtypes
from ..errors import TargetError
from .core import as_2d, fail, free_elems, on_chip, record, same_partitions

PARTITIONS_PER_CORE = 16


def _start_partition(r):
    t = r.tensor
    per_partition = int(np.prod(t._storage.shape[1:], dtype=np.int64))
    return (r.offset // per_partition) if per_partition else 0


def nonzero_with_count(dst, src, index_offset=0, padding_val=-1, name=None):
    """Per core partition: indices (+ ``index_offset``) of the non-zero elements of ``src``,
    then ``padding_val`` up to the free size, then the count (dst has one more element)."""
    o = "nonzero_with_count"
    target = context.current().target
    if target.nc_version < 3:
        context.fail(TargetError, f"{o} needs NeuronCore-v3+ (target {target.name})", op=o)
    d, x = on_chip(dst, o, "dst", ("sbuf",)), on_chip(src, o, "src", ("sbuf",))
    parts = same_partitions(o, dst=d, src=x)
    if src.dtype not in (dtypes.float32, dtypes.int32):
        fail(f"src dtype {src.dtype.name} must be float32 or int32", o, "src")
    if dst.dtype != dtypes.int32:
        fail(f"dst dtype {dst.dtype.name} must be int32", o, "dst")
    n = free_elems(x)
    if free_elems(d) != n + 1:
        fail(f"dst holds {free_elems(d)} elements per partition, must be src's {n} + 1", o, "dst")
    for role, v in (("index_offset", index_offset), ("padding_val", padding_val)):
        if not isinstance(v, (int, np.integer)) or not -2**31 <= int(v) < 2**31:
            fail(f"{role}={v!r} must be an int32", o, role)
    values = as_2d(x.read())
    out = as_2d(d.read()).astype(np.int64)
    s0, d0 = _start_partition(x), _start_partition(d)
    for p in range(parts):
        if (s0 + p) % PARTITIONS_PER_CORE or (d0 + p) % PARTITIONS_PER_CORE:
            continue
        hits = np.flatnonzero(values[p] != 0)
        row = np.full(n + 1, int(padding_val), np.int64)
        row[:hits.size] = hits + int(index_offset)
        row[n] = hits.size
        out[p] = row
    d.write(out.astype(np.int32).reshape(d.shape))
    return record(o, "gpsimd", {"dst": d, "src": x}, name=name, partitions=parts, free_elems=n)
