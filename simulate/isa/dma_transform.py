"""DMA instructions that change the data on the way: ``dma_transpose`` and ``dma_compute``.

``dma_transpose`` permutes axes as documented: 2-D (1, 0), 3-D (2, 1, 0), 4-D (3, 1, 2, 0); the
hardware-DGE form (``dge_mode.hwdge``, NeuronCore-v3+) and the indirect form (a ``vector_offset``
source: software DGE, NeuronCore-v3+, HBM source) carry the documented shape and 2-byte dtype
limits. ``dma_compute`` computes ``dst = srcs[0] * scales[0] + srcs[1] * scales[1] + ...`` in
fp32 (only ``nl.add`` with unit scales is documented as supported); with a ``vector_offset``
operand it is a read-modify-write scatter or gather of exactly two sources with unique indices.
"""

from __future__ import annotations

import math

import numpy as np

from .. import context, dtypes
from ..access import dropped, elems_in_rows, resolve, rows_in_both
from ..errors import TargetError
from .core import fail, record
from .dma_rows import source_rows
from .enums import dge_mode as dge_enum, oob_mode as oob_enum

HBM = ("private_hbm", "shared_hbm")
PERMUTATIONS = {2: (1, 0), 3: (2, 1, 0), 4: (3, 1, 2, 0)}


def _bytes(r, tensor, moved):
    return moved * tensor.dtype.itemsize if r.buffer in HBM else 0


def dma_transpose(dst, src, axes=None, priority=None, dge_mode=dge_enum.unknown,
                  oob_mode=oob_enum.error, name=None):
    """``dst = src`` with its axes permuted (see the module docstring)."""
    o = "dma_transpose"
    target = context.current().target
    oob, dge = oob_enum(oob_mode).name, dge_enum(dge_mode)
    d, s = resolve(dst, o, "dst", oob), resolve(src, o, "src", oob)
    rank = len(src.shape)
    if rank not in PERMUTATIONS:
        fail(f"src has {rank} dims; dma_transpose takes 2-D, 3-D or 4-D tiles", o, "src")
    perm = PERMUTATIONS[rank]
    if axes is not None and tuple(axes) != perm:
        fail(f"axes={tuple(axes)}: a {rank}-D transpose permutes {perm}", o, "axes")
    for role, r in (("dst", d), ("src", s)):
        if r.buffer == "psum":
            fail("PSUM is not a DMA operand", o, role)
    if dst.dtype != src.dtype and not _widened_pair(dst.dtype, src.dtype):
        fail(f"dst dtype {dst.dtype.name} must equal src's {src.dtype.name} (no cast)", o, "dst")
    out_shape = tuple(src.shape[a] for a in perm)
    if dst.size != src.size or dst.shape[0] != out_shape[0]:
        fail(f"dst {tuple(dst.shape)} must hold the transposed {out_shape}", o, "dst")
    if priority is not None and target.nc_version < 4:
        fail("priority is available on NeuronCore-v4 only", o, "priority")
    indirect = s.indirect == "vector"
    if dge not in (dge_enum.unknown, dge_enum.hwdge, dge_enum.swdge):
        fail(f"dge_mode={dge.name}: dma_transpose takes unknown, hwdge or swdge", o, "dge_mode")
    if dge == dge_enum.hwdge or indirect:
        what = "indirect" if indirect else "hwdge"
        if target.nc_version < 3:
            context.fail(TargetError, f"{what} dma_transpose needs NeuronCore-v3+ (target "
                         f"{target.name})", op=o, operand="src" if indirect else "dge_mode")
        if src.dtype.itemsize != 2:
            fail(f"{what} dma_transpose moves 2-byte dtypes, src is {src.dtype.name}", o, "src")
        if src.shape[-1] > 128:
            fail(f"src.shape[-1] = {src.shape[-1]} must be <= 128", o, "src")
    if indirect:
        if dge == dge_enum.hwdge:
            fail("an indirect transpose needs software DGE (swdge or unknown)", o, "dge_mode")
        if s.buffer not in HBM:
            fail("an indirect transpose reads HBM", o, "src")
        if src.shape[0] % 16:
            fail(f"src.shape[0] = {src.shape[0]} must be a multiple of 16", o, "src")
        if rank == 4 and src.shape[1] > 1 and src.shape[2] > 1:
            fail(f"a 4-D indirect src {tuple(src.shape)} needs shape[1] or shape[2] == 1", o,
                 "src")
        _check_transpose_indices(src._dynamic.source, o)
    elif dge == dge_enum.hwdge:
        p0 = src.shape[0]
        ok = p0 == 16 if rank == 2 else (p0 in (1, 2, 4, 8, 16) and (p0 * src.shape[-2]) % 16 == 0)
        if not ok:
            fail(f"hwdge transpose of a {rank}-D src {tuple(src.shape)}: needs shape[0] == 16 "
                 f"(2-D) or shape[0] in 1, 2, 4, 8, 16 with shape[0] * shape[-2] % 16 == 0", o,
                 "src")
    moved = 0 if dropped(d, s) else dst.size
    if moved:
        values = np.transpose(s.read(), perm)
        if s.row_mask is not None:       # a source row skipped under oob_mode.skip moves nothing:
            # its elements (the last axis of the transposed tile) keep what dst held
            keep = s.row_mask.reshape((1,) * (rank - 1) + (-1,))
            values = np.where(keep, values, d.read().reshape(values.shape))
            moved = elems_in_rows(s.row_mask, src.size, src.shape[0])
        d.write(np.ascontiguousarray(values).reshape(dst.shape))
    return record(o, "dma", {"dst": d, "src": s}, name=name, dma_bytes=moved * dst.dtype.itemsize,
                  hbm_read_bytes=_bytes(s, src, moved), hbm_write_bytes=_bytes(d, dst, moved),
                  dma_runs=_transpose_tiles(dst.shape, moved),
                  details={"dge_mode": dge.name, "indirect": indirect})


def _widened_pair(a, b) -> bool:
    """Under NKI_PRECISE_FP=0 a kernel's low-precision tiles are float32: a transpose between one
    and a host tensor of the original dtype is the same-dtype transpose of the precise run."""
    return (not context.current().precise_fp
            and dtypes.widened(a) == dtypes.widened(b) == dtypes.float32)


def _check_transpose_indices(indices, o):
    """The documented limits of an indirect transpose's indices: uint32, in SBUF, [16..128]
    partitions (a multiple of 16)."""
    if not hasattr(indices, "dtype"):
        fail("an indirect transpose takes its indices from an SBUF tile", o, "vector_offset")
    if indices.dtype != dtypes.uint32:
        fail(f"indices dtype {indices.dtype.name} must be uint32", o, "vector_offset")
    if indices._storage.buffer != "sbuf":
        fail(f"indices must be in SBUF, not {indices._storage.buffer}", o, "vector_offset")
    parts = indices.shape[0]
    if not 16 <= parts <= 128 or parts % 16:
        fail(f"indices span {parts} partitions: 16 to 128, a multiple of 16", o, "vector_offset")


TRANSPOSE_TILE = (128, 16)      # partitions x elements: the unit the DMA engines write


def _transpose_tiles(dst_shape, moved: int) -> int:
    """Descriptors of a DMA transpose: the destination is written one [par_dim(128), 16] tile
    at a time by the 16 DMA engines (the Trainium2 architecture guide, DMA transpose: "up to 90%
    DMA throughput utilization"), not an element at a time. None moved: none."""
    if moved == 0:
        return 0
    parts = dst_shape[0] if dst_shape else 1
    free = math.prod(dst_shape[1:]) if len(dst_shape) > 1 else 1
    return -(-parts // TRANSPOSE_TILE[0]) * -(-free // TRANSPOSE_TILE[1])


def dma_compute(dst, srcs, reduce_op, scales=None, unique_indices=True, oob_mode=oob_enum.error,
                name=None):
    """``dst = sum(srcs[i] * scales[i])`` in fp32 on the DMA engines."""
    o = "dma_compute"
    oob = oob_enum(oob_mode).name
    if getattr(reduce_op, "name", None) != "add":
        fail(f"reduce_op={reduce_op!r}: only nl.add is supported", o, "reduce_op")
    srcs = list(srcs)
    if not 1 <= len(srcs) <= 16:
        fail(f"{len(srcs)} sources: dma_compute takes 1 to 16", o, "srcs")
    scales = [1.0] * len(srcs) if scales is None else list(scales)
    if len(scales) != len(srcs) or any(float(x) != 1.0 for x in scales):
        fail(f"scales={scales!r}: one per source, all 1.0 (the only supported value)", o,
             "scales")
    d = resolve(dst, o, "dst", oob)
    rs = [resolve(t, o, f"srcs[{k}]", oob) for k, t in enumerate(srcs)]
    for role, r in [("dst", d)] + [(f"srcs[{k}]", r) for k, r in enumerate(rs)]:
        if r.buffer == "psum":
            fail("PSUM is not a DMA operand", o, role)
    for k, t in enumerate(srcs):
        if t.size != dst.size:
            fail(f"srcs[{k}] holds {t.size} elements, dst {dst.size}", o, f"srcs[{k}]")
    rmw = d.indirect == "vector" or any(r.indirect == "vector" for r in rs)
    if rmw:
        if len(srcs) != 2:
            fail("a read-modify-write (vector_offset) dma_compute takes exactly 2 sources", o,
                 "srcs")
        if not unique_indices:
            fail("unique_indices=False is not supported (non-unique indices)", o,
                 "unique_indices")
        for role, r in [("dst", d)] + [(f"srcs[{k}]", r) for k, r in enumerate(rs)]:
            if r.indices is not None:
                rows = r.indices.reshape(r.indices.shape[0], -1)[:, 0]
                if np.unique(rows).size != rows.size:
                    fail("indices repeat a row; dma_compute needs unique indices", o, role)
        target = context.current().target
        if target.nc_version < 3:
            context.fail(TargetError, f"read-modify-write dma_compute (vector_offset) needs "
                         f"NeuronCore-v3+ (target {target.name})", op=o, operand="dst")
    moved = 0 if dropped(d, *rs) else dst.size
    rows = source_rows([(f"srcs[{k}]", r) for k, r in enumerate(rs)], dst.shape[0], o)
    if moved:
        with np.errstate(all="ignore"):
            total = sum(r.read().astype(np.float32).reshape(dst.shape) for r in rs)
        # a row any source skipped (oob_mode.skip) leaves dst's row as it was
        d.write(dtypes.cast(np.asarray(total, np.float32), dst.dtype).reshape(dst.shape),
                row_mask=rows)
        moved = elems_in_rows(rows_in_both(rows, d.row_mask), dst.size, dst.shape[0])
    reads = sum(_bytes(r, t, moved) for r, t in zip(rs, srcs))
    return record(o, "dma", {"dst": d, **{f"src{k}": r for k, r in enumerate(rs)}}, name=name,
                  dma_bytes=moved * dst.dtype.itemsize, hbm_read_bytes=reads,
                  hbm_write_bytes=_bytes(d, dst, moved), dma_runs=1,
                  details={"rmw": rmw, "sources": len(srcs)})
