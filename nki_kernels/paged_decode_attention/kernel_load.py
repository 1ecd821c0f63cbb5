"""Load one chunk of a request's K and V from the paged cache into SBUF (tokens on partitions).

Only the request's own tokens are read: tokens past its length or before its window get an
out-of-bounds row (skipped by ``oob_mode.skip``) on NeuronCore-v3+, or, on v2, whole pages outside
them are skipped and the few unused rows of a partly used page are zeroed after the load.
"""

from __future__ import annotations

from nki_kernels.backend import nisa, nl

SENTINEL = 2 ** 31 - 1          # a row/page id past any cache: dropped by oob_mode.skip


def broadcast_scalar(src_hbm, index, parts, name):
    """[parts, 1] int32 tile holding src_hbm[index, 0] in every partition."""
    t = nl.ndarray((parts, 1), nl.int32, buffer=nl.sbuf, name=name)
    nisa.dma_copy(dst=t, src=src_hbm.ap([[0, parts], [1, 1]], offset=index))
    return t


def mask_sentinel(dst, values, valid):
    """dst = values where valid (0/1 ints) else SENTINEL, in exact int32 math."""
    keep = nl.ndarray(values.shape, nl.int32, buffer=nl.sbuf, name="keep")
    nisa.tensor_tensor(dst=keep, data1=values, data2=valid, op=nl.multiply)
    drop = nl.ndarray(values.shape, nl.int32, buffer=nl.sbuf, name="drop")
    nisa.tensor_scalar(dst=drop, data=valid, op0=nl.subtract, operand0=1, reverse0=True,
                       op1=nl.multiply, operand1=SENTINEL)
    nisa.tensor_tensor(dst=dst, data1=keep, data2=drop, op=nl.add)


def token_validity(c, T, L_t, W_t):
    """[T, 1] int32: 1 where chunk c's token t is inside [W, L) (W: window start)."""
    pos = nl.ndarray((T, 1), nl.int32, buffer=nl.sbuf, name="pos")
    nisa.iota(dst=pos, pattern=[[1, 1]], offset=c * T, channel_multiplier=1)
    ok = nl.ndarray((T, 1), nl.int32, buffer=nl.sbuf, name="tok_ok")
    nisa.tensor_tensor(dst=ok, data1=pos, data2=L_t, op=nl.less)
    late = nl.ndarray((T, 1), nl.int32, buffer=nl.sbuf, name="tok_late")
    nisa.tensor_tensor(dst=late, data1=pos, data2=W_t, op=nl.greater_equal)
    nisa.tensor_tensor(dst=ok, data1=ok, data2=late, op=nl.multiply)
    return ok


def load_chunk_indirect(tiles, sources, kv_indices, ptr_t, tok_tab_sb, valid_t, geo, c):
    """NeuronCore-v3+: per-token rows computed on device, one indirect DMA per K / V."""
    T, page_size, rpp, es, hs, D, H = geo
    slot0, entry0 = divmod(c * T, page_size)
    slot = nl.ndarray((T, 1), nl.int32, buffer=nl.sbuf, name="slot")
    nisa.tensor_scalar(dst=slot, data=tok_tab_sb[:, 0:1], op0=nl.add, operand0=slot0)
    nisa.tensor_tensor(dst=slot, data1=slot, data2=ptr_t, op=nl.add)
    page = nl.ndarray((T, 1), nl.int32, buffer=nl.sbuf, name="page")
    nisa.dma_copy(dst=page, src=kv_indices.ap([[1, T], [1, 1]], vector_offset=slot, indirect_dim=0),
                  oob_mode=nisa.oob_mode.skip)
    row = nl.ndarray((T, 1), nl.int32, buffer=nl.sbuf, name="row")
    nisa.tensor_scalar(dst=row, data=tok_tab_sb[:, 1:2], op0=nl.add, operand0=entry0,
                       op1=nl.multiply, operand1=es)
    rowp = nl.ndarray((T, 1), nl.int32, buffer=nl.sbuf, name="row_page")
    nisa.tensor_scalar(dst=rowp, data=page, op0=nl.multiply, operand0=rpp)
    nisa.tensor_tensor(dst=row, data1=row, data2=rowp, op=nl.add)
    if valid_t is not None:
        mask_sentinel(row, row, valid_t)
    for tile, (rows, offset) in zip(tiles, sources):
        if valid_t is not None:
            nisa.memset(dst=tile, value=0.0)          # skipped rows must read as 0, not NaN
        src = rows.ap([[D, T], [hs * D, H], [1, D]], offset=offset, vector_offset=row, indirect_dim=0)
        nisa.dma_copy(dst=tile, src=src, oob_mode=nisa.oob_mode.skip)


def load_chunk_pages(tiles, sources, kv_indices, ptr_1, L_1, W_1, valid_t, geo, c):
    """NeuronCore-v2: one scalar-offset DMA per page (slot) of the chunk, then zero unused rows.
    ``valid_t`` None: a full chunk (all its pages and rows belong to the request), nothing to mask."""
    T, page_size, rpp, es, hs, D, H = geo
    slot0, entry0 = divmod(c * T, page_size)
    span = min(page_size, T)
    nslots = T // span
    pid = nl.ndarray((1, nslots), nl.int32, buffer=nl.sbuf, name="pid")
    nisa.dma_copy(dst=pid, src=kv_indices.ap([[1, 1], [1, nslots]], offset=slot0,
                                             scalar_offset=ptr_1, indirect_dim=0))
    if valid_t is not None:
        first = nl.ndarray((1, nslots), nl.int32, buffer=nl.sbuf, name="slot_first")
        nisa.iota(dst=first, pattern=[[span, nslots]], offset=c * T, channel_multiplier=0)
        ok = nl.ndarray((1, nslots), nl.int32, buffer=nl.sbuf, name="slot_ok")
        nisa.tensor_scalar(dst=ok, data=first, op0=nl.less, operand0=L_1)
        end = nl.ndarray((1, nslots), nl.int32, buffer=nl.sbuf, name="slot_end")
        nisa.tensor_scalar(dst=end, data=first, op0=nl.add, operand0=span - 1,
                           op1=nl.greater_equal, operand1=W_1)
        nisa.tensor_tensor(dst=ok, data1=ok, data2=end, op=nl.multiply)
        mask_sentinel(pid, pid, ok)
        pred = nl.ndarray((T, H * D), nl.uint8, buffer=nl.sbuf, name="pred")
        nisa.memset(dst=pred, value=0)
        nisa.tensor_scalar(dst=pred, data=pred, op0=nl.add, operand0=valid_t)
    for tile, (rows, offset) in zip(tiles, sources):
        pages = rows.reshape((rows.shape[0] // rpp, rpp * D))
        raw = tile                                   # a full chunk: every row is loaded
        if valid_t is not None:
            raw = nl.ndarray((T, H * D), tile.dtype, buffer=nl.sbuf, name="kv_raw")
            nisa.memset(dst=raw, value=0.0)
        for j in range(nslots):
            src = pages.ap([[es * D, span], [hs * D, H], [1, D]], offset=offset + entry0 * es * D,
                           scalar_offset=pid[0:1, j:j + 1], indirect_dim=0)
            nisa.dma_copy(dst=raw[j * span:(j + 1) * span, :], src=src, oob_mode=nisa.oob_mode.skip)
        if valid_t is not None:
            nisa.memset(dst=tile, value=0.0)
            nisa.tensor_copy_predicated(dst=tile, src=raw, predicate=pred)
