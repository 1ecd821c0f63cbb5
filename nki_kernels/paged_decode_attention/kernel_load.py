"""Load one chunk of a request's K and V from the paged cache into SBUF (tokens on partitions).

Only the request's own tokens are read. Two paths, both driven by the cursor of kernel_cursor.py:

- ``load_chunk_indirect`` (NeuronCore-v3+): each token's cache row is computed on device and one
  indirect DMA per K / V gathers the chunk; tokens outside [W, L) get row -1, skipped by
  ``oob_mode.skip`` (their tile rows are zeroed first). Row ids are computed on VectorE's fp32
  ALU, so this path is used when the cache has fewer than 2**24 rows (``ROW_LIMIT``).
- ``load_chunk_pages`` (NeuronCore-v2, and larger caches): one DMA per page (or 128-token piece of
  a page) of the chunk, addressed by a ``scalar_offset`` that the DMA engine multiplies out, so any
  cache size is exact; pieces outside [W, L) are skipped and the unused rows of a partly used page
  are zeroed after the load.
"""

from __future__ import annotations

from nki_kernels.backend import nisa, nl

from .kernel_cursor import drop_invalid

ROW_LIMIT = 2 ** 24      # fp32 represents every integer below this exactly


def load_chunk_indirect(tiles, sources, kv_indices, cursor, valid_t, geo):
    """tiles: K and V [T, H*D] in SBUF; sources: (rows [R, D] @ HBM, element offset) per tile."""
    T, D, H = geo.T, geo.D, geo.H
    page = nl.ndarray((T, 1), nl.int32, buffer=nl.sbuf, name="page")
    nisa.dma_copy(dst=page, src=kv_indices.ap([[1, T], [1, 1]], vector_offset=cursor["slot"],
                                              indirect_dim=0), oob_mode=nisa.oob_mode.skip)
    row = nl.ndarray((T, 1), nl.int32, buffer=nl.sbuf, name="row")
    nisa.tensor_scalar(dst=row, data=cursor["entry"], op0=nl.multiply, operand0=geo.entry_stride)
    rowp = nl.ndarray((T, 1), nl.int32, buffer=nl.sbuf, name="row_page")
    nisa.tensor_scalar(dst=rowp, data=page, op0=nl.multiply, operand0=geo.rows_per_page)
    nisa.tensor_tensor(dst=row, data1=row, data2=rowp, op=nl.add)
    if valid_t is not None:
        drop_invalid(row, row, valid_t)
    for tile, (rows, offset) in zip(tiles, sources):
        if valid_t is not None:
            nisa.memset(dst=tile, value=0.0)          # skipped rows must read as 0, not NaN
        src = rows.ap([[D, T], *geo.token_pattern], offset=offset, vector_offset=row,
                      indirect_dim=0)
        nisa.dma_copy(dst=tile, src=src, oob_mode=nisa.oob_mode.skip)


def piece(geo):
    """(tokens per DMA, pieces per chunk, pieces per page): a whole page when P <= 128, else a
    128-token piece of one."""
    span = min(geo.page_size, geo.T)
    return span, geo.T // span, geo.page_size // span


def load_chunk_pages(tiles, sources, kv_indices, cursor, bounds, valid_t, geo):
    """``valid_t`` None: a full chunk (every token belongs to the request), nothing to mask."""
    T, D, H, es = geo.T, geo.D, geo.H, geo.entry_stride
    span, nslots, per_page = piece(geo)
    # elements per piece (the scalar offset's unit): a whole page, or 128 entries of one
    unit = geo.rows_per_page * D if per_page == 1 else span * es * D
    pid = nl.ndarray((1, nslots), nl.int32, buffer=nl.sbuf, name="pid")
    nisa.dma_copy(dst=pid, src=kv_indices.ap([[1, 1], [1, nslots]], scalar_offset=cursor["slot"][0:1, :],
                                             indirect_dim=0))
    if per_page > 1:                         # piece id = page * pieces per page + entry // 128
        units = geo.rows_per_page * D // unit
        sub = nl.ndarray((1, 1), nl.int32, buffer=nl.sbuf, name="sub_piece")
        nisa.tensor_scalar(dst=sub, data=cursor["entry"][0:1, :], op0=nl.divide, operand0=span)
        nisa.tensor_scalar(dst=pid, data=pid, op0=nl.multiply, operand0=units, op1=nl.add,
                           operand1=sub)
    if valid_t is not None:
        _drop_pieces_outside(pid, cursor, bounds, span, nslots)
        pred = nl.ndarray((T, H * D), nl.uint8, buffer=nl.sbuf, name="pred")
        nisa.memset(dst=pred, value=0)
        nisa.tensor_scalar(dst=pred, data=pred, op0=nl.add, operand0=valid_t)
    for tile, (rows, offset) in zip(tiles, sources):
        pieces = rows.reshape((rows.shape[0] * D // unit, unit))
        raw = tile                                   # a full chunk: every row is loaded
        if valid_t is not None:
            raw = nl.ndarray((T, H * D), tile.dtype, buffer=nl.sbuf, name="kv_raw")
            nisa.memset(dst=raw, value=0.0)
        for j in range(nslots):
            src = pieces.ap([[es * D, span], *geo.token_pattern], offset=offset,
                            scalar_offset=pid[0:1, j:j + 1], indirect_dim=0)
            nisa.dma_copy(dst=raw[j * span:(j + 1) * span, :], src=src, oob_mode=nisa.oob_mode.skip)
        if valid_t is not None:
            nisa.memset(dst=tile, value=0.0)
            nisa.tensor_copy_predicated(dst=tile, src=raw, predicate=pred)


def _drop_pieces_outside(pid, cursor, bounds, span, nslots):
    """pid[j] = -1 for pieces with no token in [W, L) (piece j holds positions start + j*span ..
    start + (j+1)*span - 1)."""
    first = nl.ndarray((1, nslots), nl.int32, buffer=nl.sbuf, name="piece_first")
    nisa.iota(dst=first, pattern=[[span, nslots]], offset=0, channel_multiplier=0)
    nisa.tensor_scalar(dst=first, data=first, op0=nl.add, operand0=cursor["pos"][0:1, :])
    ok = nl.ndarray((1, nslots), nl.int32, buffer=nl.sbuf, name="piece_ok")
    nisa.tensor_scalar(dst=ok, data=first, op0=nl.less, operand0=bounds.L_t[0:1, :])
    last = nl.ndarray((1, nslots), nl.int32, buffer=nl.sbuf, name="piece_end")
    nisa.tensor_scalar(dst=last, data=first, op0=nl.add, operand0=span - 1,
                       op1=nl.greater_equal, operand1=bounds.W_t[0:1, :])
    nisa.tensor_tensor(dst=ok, data1=ok, data2=last, op=nl.multiply)
    drop_invalid(pid, pid, ok)
