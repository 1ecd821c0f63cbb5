"""The device half of the paged KV append: scatter token rows into cache rows.

Dimensions:  T tokens, R cache rows, H kv heads, D head_dim, P page_size
Args:
    k_rows: [R, row_elems] @ HBM, the K cache (or the whole fused cache) as rows, written in place
    v_rows: [R, row_elems] @ HBM, or None for a fused cache (V = k_rows + v_offset elements)
    key, value: [T, H, D] @ HBM, same dtype as the cache
    slots: [T, 1] int32 @ HBM, first cache row of each token (see layout.py); rows of skipped
        tokens hold SKIP_SLOT, which is out of bounds and dropped by ``oob_mode.skip``
    heads, head_stride: HND: a token's H head rows are ``head_stride`` elements apart (P * D);
        NHD: heads == 1 (the token's H*D elements are one row)
Paths:
    NeuronCore-v3+ (trn2): per tile of <= 128 tokens, K and V rows are loaded to SBUF (tokens on
        partitions) and written with one indirect DMA each (``vector_offset`` = the tile's slots);
        NHD moves one contiguous H*D run per token, HND H runs of D.
    NeuronCore-v2 (trn1, no indirect DMA): the same tiles, written with one ``scalar_offset`` DMA
        per token and tensor (K, V).
HBM traffic is the appended K/V bytes read plus written (and 4 bytes of slot per token).
"""

from __future__ import annotations

from nki_kernels.backend import nki, nisa, nl

P_MAX = 128
SKIP_SLOT = 2 ** 31 - 1


@nki.jit
def paged_kv_scatter_kernel(k_rows, v_rows, key, value, slots, heads, head_stride, v_offset):
    T = key.shape[0]
    row_elems = k_rows.shape[1]
    token_elems = key.shape[1] * key.shape[2]
    indirect = nisa.get_nc_version() >= 3
    for t0 in range(0, T, P_MAX):
        n = min(P_MAX, T - t0)
        slot_sb = nl.ndarray((n, 1), nl.int32, buffer=nl.sbuf, name="slot_sb")
        nisa.dma_copy(dst=slot_sb, src=slots[t0:t0 + n, :])
        targets = ((key, k_rows, 0), (value, k_rows if v_rows is None else v_rows,
                                      v_offset if v_rows is None else 0))
        for src_hbm, rows, offset in targets:
            tile = nl.ndarray((n, token_elems), key.dtype, buffer=nl.sbuf, name="kv_sb")
            nisa.dma_copy(dst=tile, src=src_hbm.ap([[token_elems, n], [1, token_elems]],
                                                   offset=t0 * token_elems))
            if indirect:
                dst = rows.ap([[row_elems, n], [head_stride, heads], [1, row_elems]], offset=offset,
                              vector_offset=slot_sb, indirect_dim=0)
                nisa.dma_copy(dst=dst, src=tile, oob_mode=nisa.oob_mode.skip)
            else:
                for i in range(n):
                    dst = rows.ap([[head_stride, heads], [1, row_elems]], offset=offset,
                                  scalar_offset=slot_sb[i:i + 1, 0:1], indirect_dim=0)
                    nisa.dma_copy(dst=dst, src=tile[i:i + 1, :], oob_mode=nisa.oob_mode.skip)
