"""``nisa.dma_copy``: HBM<->SBUF, HBM<->HBM and SBUF<->SBUF copies, with indirect rows.

Rules modelled: element counts match; PSUM is never a source; a dtype change casts through fp32
(refused with hwdge); indirect (``vector_offset``) access needs software DGE and, here, a
NeuronCore-v3+ target; ``hwdge`` needs v3+; ``oob_mode.skip`` leaves the rows of out-of-bounds
indices untouched. Row ``w`` of an indirect side pairs with row ``w`` (dim 0) of the other side.
"""

from __future__ import annotations

import functools


from nki_kernels import access_patterns as aps

from .. import context, dtypes
from ..access import Resolved, dropped, elems_in_rows, resolve
from ..errors import TargetError
from .core import fail, record
from .dma_rows import source_rows
from .enums import dge_mode as dge_enum, oob_mode as oob_enum

OP = "dma_copy"


def dma_copy(dst, src, priority=None, oob_mode=oob_enum.error, dge_mode=dge_enum.unknown,
             engine=None, name=None):
    """``dst = src`` through the DMA engines."""
    oob = oob_enum(oob_mode).name
    dge = dge_enum(dge_mode)
    target = context.current().target
    d = resolve(dst, OP, "dst", oob)
    s = resolve(src, OP, "src", oob)
    if s.buffer == "psum":
        fail("PSUM cannot be a DMA source (since NKI 0.3.0); evict with tensor_copy first", OP, "src")
    if d.buffer == "psum":
        fail("PSUM cannot be a DMA destination; matmul writes PSUM", OP, "dst")
    if dst.size != src.size:
        fail(f"element counts differ: dst {dst.shape} has {dst.size}, src {src.shape} has "
             f"{src.size}", OP)
    indirect = d.indirect == "vector" or s.indirect == "vector"
    if indirect and not target.indirect_dma:
        context.fail(TargetError, f"indirect DMA (vector_offset) is modelled as NeuronCore-v3+ "
                     f"only; target {target.name} needs one dynamic-offset DMA per row",
                     op=OP, operand="dst" if d.indirect == "vector" else "src")
    if dge == dge_enum.hwdge:
        if not target.hwdge:
            context.fail(TargetError, f"dge_mode=hwdge needs NeuronCore-v3+, target is "
                         f"{target.name}", op=OP, operand="dge_mode")
        if indirect:
            fail("indirect DMA needs software DGE (dge_mode=swdge), not hwdge", OP, "dge_mode")
        if dst.dtype != src.dtype:
            fail(f"hwdge cannot cast {src.dtype.name} -> {dst.dtype.name}", OP, "dge_mode")
    if priority is not None and target.nc_version < 4:
        fail("priority is available on NeuronCore-v4 only", OP, "priority")
    row_mask = _row_mask(d, s)
    if not dropped(d, s):
        values = s.read()
        if dst.dtype != src.dtype:
            values = dtypes.cast(values, dst.dtype)
        d.write(values.reshape(dst.shape), row_mask=row_mask if s.row_mask is not None else None)
    moved = _moved_elems(d, s, row_mask)
    itemsize = dst.dtype.itemsize
    hbm = ("private_hbm", "shared_hbm")
    return record(OP, "dma", {"dst": d, "src": s}, name=name, dma_bytes=moved * itemsize,
                  hbm_read_bytes=moved * src.dtype.itemsize if s.buffer in hbm else 0,
                  hbm_write_bytes=moved * itemsize if d.buffer in hbm else 0,
                  dma_runs=_runs(d, s, moved),
                  details={"dge_mode": dge.name, "oob_mode": oob, "indirect": indirect,
                           "queue_engine": None if engine is None else str(engine)})


def _row_mask(d: Resolved, s: Resolved):
    """The rows written: the source's kept rows when it skips some, else the destination's."""
    mask = source_rows([("src", s)], _rows(d), OP)
    return mask if mask is not None else d.row_mask


def _moved_elems(d, s, mask) -> int:
    if dropped(d, s):
        return 0
    return elems_in_rows(mask, d.tensor.size, _rows(d))


def _rows(r: Resolved) -> int:
    """The operand's rows (its first dimension; a 0-d view, an integer index into an HBM
    tensor, is one element)."""
    return r.shape[0] if r.shape else 1


def _run_elems(r: Resolved) -> int:
    """Longest contiguous run of the operand: within one row when rows are gathered (indirect)
    or are partitions of SBUF / PSUM (each partition is its own memory, so a descriptor never
    spans two: the DMA guide counts payload per partition)."""
    t = r.tensor
    pattern = tuple(zip(t.strides, t.shape)) or ((1, 1),)    # a 0-d view: one element
    if r.indices is not None or r.buffer in ("sbuf", "psum"):
        pattern = pattern[1:] or ((1, 1),)
    return _contiguous_run(pattern)


@functools.lru_cache(maxsize=4096)
def _contiguous_run(pattern) -> int:
    """``aps.contiguous_run`` of a (step, num) pattern from offset 0 (kernels repeat a few)."""
    return aps.contiguous_run(aps.AccessPattern(pattern, 0))


def _runs(d, s, moved: int) -> int:
    """Contiguous pieces the move splits into (a chunk must be contiguous on both sides)."""
    if moved == 0:
        return 0
    run = min(_run_elems(d), _run_elems(s))
    while moved % run:
        run -= 1
    return moved // run
