"""VectorE cross-partition movement inside 32-partition quadrants: ``nc_stream_shuffle``.

``dst`` partition ``q*32 + i`` takes ``src`` partition ``q*32 + shuffle_mask[i]`` (relative to each
operand's access) for every quadrant ``q``; mask value 255 leaves that dst partition unmodified.
Start partitions follow the active-partition rule: 96/128 active -> start 0; 64 -> 0 or 64;
32 -> 0, 32, 64 or 96.
"""

from __future__ import annotations

import numpy as np

from .core import as_2d, fail, free_elems, on_chip, record
from .gpsimd import _start_partition

QUADRANT = 32
KEEP = 255


def nc_stream_shuffle(dst, src, shuffle_mask, name=None):
    o = "nc_stream_shuffle"
    d, x = on_chip(dst, o, "dst"), on_chip(src, o, "src")
    if dst.dtype != src.dtype:
        fail(f"dst dtype {dst.dtype.name} must equal src dtype {src.dtype.name}", o, "dst")
    n = free_elems(x)
    if free_elems(d) != n:
        fail(f"dst holds {free_elems(d)} elements per partition, src {n}", o, "dst")
    mask = list(shuffle_mask)
    if len(mask) != QUADRANT:
        fail(f"shuffle_mask has {len(mask)} entries, must be {QUADRANT}", o, "shuffle_mask")
    for i, m in enumerate(mask):
        if not isinstance(m, (int, np.integer)) or not (0 <= m < QUADRANT or m == KEEP):
            fail(f"shuffle_mask[{i}]={m!r} must be a partition 0..31 or 255 (keep)", o,
                 "shuffle_mask")
    src_parts, dst_parts = x.shape[0], d.shape[0]
    active = -(-max(src_parts, dst_parts) // QUADRANT) * QUADRANT
    legal = (0,) if active > 64 else (0, 64) if active > 32 else (0, 32, 64, 96)
    for role, r in (("src", x), ("dst", d)):
        start = _start_partition(r)
        if start not in legal:
            fail(f"{role} starts at partition {start}; with {active} active partitions the start "
                 f"must be {' or '.join(map(str, legal))}", o, role)
    values = as_2d(x.read())
    out = as_2d(d.read()).copy()
    for p in range(dst_parts):
        m = mask[p % QUADRANT]
        if m == KEEP:
            continue
        s = (p // QUADRANT) * QUADRANT + m
        if s >= src_parts:
            fail(f"dst partition {p} reads src partition {s}, beyond src's {src_parts}", o,
                 "shuffle_mask")
        out[p] = values[s]
    d.write(out.reshape(d.shape))
    return record(o, "vector", {"dst": d, "src": x}, name=name, partitions=dst_parts,
                  free_elems=n)
