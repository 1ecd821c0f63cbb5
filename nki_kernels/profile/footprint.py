"""What memory an instruction reads and writes, as boxes the scheduler can test for overlap.

A footprint is ``(buffer ident, p0, p1, b0, b1)``: partitions ``[p0, p1)`` and bytes ``[b0, b1)``
within each of them (on chip), or bytes ``[b0, b1)`` of the flat tensor (HBM, one "partition").
The box is the bounding box of the access pattern, so two interleaved accesses of one tile
overlap (a false dependency, never a missed one). A vector-indirect access (gather/scatter by
indices read at run time) covers its whole buffer. Tensors placed by ``address=`` share one
ident per buffer and are offset by their address, so placed tiles that overlap physically
depend on each other however they were declared.
"""

from __future__ import annotations

from typing import Tuple

HBM = ("private_hbm", "shared_hbm")
EVERYTHING = 1 << 62

# operand roles an instruction writes; every other operand is read
WRITTEN = frozenset({"dst", "reduce_res", "val_dst", "idx_dst", "dst_idx", "dst_scale"})

Box = Tuple[int, int, int, int, int]


def _span(pattern) -> Tuple[int, int]:
    """(lowest, highest) element offset of an access pattern relative to its start."""
    lo = hi = 0
    for step, num in pattern:
        reach = (num - 1) * step
        if reach < 0:
            lo += reach
        else:
            hi += reach
    return lo, hi


def footprint(o) -> Box:
    """The box operand ``o`` (a ``simulate.trace.Operand``) touches."""
    if o.indirect == "vector" or not o.pattern:
        return (o.storage, 0, EVERYTHING, 0, EVERYTHING)
    size = o.itemsize
    if o.buffer in HBM:
        lo, hi = _span(o.pattern)
        return (o.storage, 0, 1, (o.offset + lo) * size, (o.offset + hi + 1) * size)
    row = o.row_bytes // size if o.row_bytes else 0
    step, parts = o.pattern[0]
    if row <= 0 or (parts > 1 and step % row):
        return (o.storage, 0, EVERYTHING, 0, EVERYTHING)
    p0 = o.offset // row
    p1 = p0 + (parts - 1) * (step // row) + 1 if parts > 1 else p0 + 1
    lo, hi = _span(o.pattern[1:])
    b0, b1 = (o.offset % row + lo) * size, (o.offset % row + hi + 1) * size
    if b0 < 0 or b1 > o.row_bytes:          # the free pattern leaves the row: the whole rows
        b0, b1 = 0, o.row_bytes
    if o.address is not None:
        p0, p1 = p0 + o.address[0], p1 + o.address[0]
        b0, b1 = b0 + o.address[1], b1 + o.address[1]
    return (o.storage, p0, p1, b0, b1)


def overlaps(a: Box, b: Box) -> bool:
    """Same buffer and intersecting boxes (the ident is compared by the caller's dict)."""
    return a[1] < b[2] and b[1] < a[2] and a[3] < b[4] and b[3] < a[4]


def covers(a: Box, b: Box) -> bool:
    """``a`` contains ``b``."""
    return a[1] <= b[1] and b[2] <= a[2] and a[3] <= b[3] and b[4] <= a[4]
