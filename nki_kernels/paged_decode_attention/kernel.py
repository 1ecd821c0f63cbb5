"""Batch decode attention over a paged KV cache as an NKI kernel (online softmax over KV chunks).

Dimensions:  B requests, HQ query heads, H kv heads, G = HQ / H, D head_dim (<= 512), T chunk tokens
Args (device):
    q: [B, HQ, D] @ HBM (fp32 / fp16 / bf16)
    k_rows, v_rows: the cache as rows of D elements [R, D] @ HBM (v_rows None for a fused cache:
        V rows sit ``v_rows_offset`` rows after K rows)
    kv_indptr: [B + 1, 1] int32; kv_indices: [pages + T, 1] int32 (padded); kv_lens, win_start: [B, 1]
    tok_tab: [T, 2] int32 (page slot, entry of chunk token t); sinks: [HQ, 1] fp32 or None
    static: plan fields (chunk ranges per request, row strides), scale = sm_scale * k_scale,
        soft_cap, v_scale
Returns out [B, HQ, D] (q dtype) and lse [B, HQ] fp32, base 2, @ shared HBM.
Tiling per request and group of kv heads (rows R = heads x G <= 128 on partitions): scores[R, T]
accumulate one matmul per head in PSUM fp32 (stationary = that head's qT zero-padded to R columns,
moving = K^T made on TensorE, D > 128 in 128-row K-tiles), one online softmax for the whole group
(VectorE max, ScalarE exp with fused row sum, running rescale), out[R, D] accumulates P^T masked to
each head's columns @ V of that head.
Paths: NeuronCore-v3+ gathers each chunk's token rows with one indirect DMA per K/V; NeuronCore-v2
reads whole pages with one scalar-offset DMA each (see kernel_load.py).
"""

from __future__ import annotations

from nki_kernels.backend import nki, nisa, nl

from .kernel_load import broadcast_scalar, load_chunk_indirect, load_chunk_pages, token_validity
from .kernel_softmax import (column_masks, finalize, init_state, mask_bias, online_update,
                             padded_queries)

LOG2E = 1.4426950408889634


@nki.jit
def batch_decode_kernel(q, k_rows, v_rows, kv_indptr, kv_indices, kv_lens, win_start, tok_tab,
                        sinks, num_kv_heads, page_size, chunks, strides, scale, soft_cap, v_scale,
                        mm_dtype):
    B, HQ, D = q.shape
    H, G = num_kv_heads, HQ // num_kv_heads
    T = tok_tab.shape[0]
    rpp, es, hs, v_rows_offset = strides
    geo = (T, page_size, rpp, es, hs, D, H)
    sources = ((k_rows, 0), (k_rows, v_rows_offset * D) if v_rows is None else (v_rows, 0))
    out = nl.ndarray((B, HQ, D), q.dtype, buffer=nl.shared_hbm, name="out")
    lse = nl.ndarray((B, HQ, 1), nl.float32, buffer=nl.shared_hbm, name="lse")
    indirect = nisa.get_nc_version() >= 3
    tok_sb = nl.ndarray((T, 2), nl.int32, buffer=nl.sbuf, name="tok_tab")
    nisa.dma_copy(dst=tok_sb, src=tok_tab)
    per_group = max(1, min(H, 128 // G))                   # kv heads per tile: rows = heads x G <= 128
    groups = [(h0, min(per_group, H - h0)) for h0 in range(0, H, per_group)]
    masks = {n: column_masks(T, n, G, mm_dtype) for n in sorted({n for _, n in groups})}
    # OCP fp8 (e4m3fn) is a matmul input from NeuronCore-v4 only: V is converted per chunk before.
    convert_v = k_rows.dtype == nl.float8_e4m3fn and nisa.get_nc_version() < nisa.nc_version.gen4
    for b in range(B):
        c0, c1, full_lo, full_hi = chunks[b]
        if c0 == c1:
            _empty_request(out, lse, sinks, b, HQ, D)
            continue
        qT = _load_q(q, b, mm_dtype)
        q_pads = [padded_queries(qT, h0, n, G, mm_dtype) for h0, n in groups]
        states = [init_state(n * G, D) for _, n in groups]
        R = per_group * G
        L_g = broadcast_scalar(kv_lens, b, R, "len_g")
        W_g = broadcast_scalar(win_start, b, R, "win_g")
        L_t = broadcast_scalar(kv_lens, b, T, "len_t")
        W_t = broadcast_scalar(win_start, b, T, "win_t")
        ptr_t = broadcast_scalar(kv_indptr, b, T, "ptr_t")
        for c in range(c0, c1):
            masked = not full_lo <= c < full_hi          # boundary chunk: some tokens excluded
            valid_t = token_validity(c, T, L_t, W_t) if masked else None
            tiles = [nl.ndarray((T, H * D), k_rows.dtype, buffer=nl.sbuf, name=n) for n in ("k_sb", "v_sb")]
            if indirect:
                load_chunk_indirect(tiles, sources, kv_indices, ptr_t, tok_sb, valid_t, geo, c)
            else:
                load_chunk_pages(tiles, sources, kv_indices, ptr_t[0:1, :], L_t[0:1, :],
                                 W_t[0:1, :], valid_t, geo, c)
            if convert_v:
                v_mm = nl.ndarray((T, H * D), mm_dtype, buffer=nl.sbuf, name="v_mm")
                nisa.tensor_copy(dst=v_mm, src=tiles[1])
                tiles[1] = v_mm
            bias = mask_bias(c, T, R, L_g, W_g) if masked else None
            for (h0, n), state, pads in zip(groups, states, q_pads):
                online_update(state, pads, masks[n], tiles[0], tiles[1], h0, D,
                              None if bias is None else bias[0:n * G, :], scale, soft_cap, mm_dtype)
        for (h0, n), state in zip(groups, states):
            finalize(state, out, lse, sinks, b, h0 * G, v_scale)
    return out, lse


def _load_q(q, b, mm_dtype):
    """qT tiles [Dp, HQ] (Dp <= 128 rows of the head dim), converted to the matmul dtype."""
    _, HQ, D = q.shape
    tiles = []
    for d0 in range(0, D, 128):
        dp = min(128, D - d0)
        t = nl.ndarray((dp, HQ), mm_dtype, buffer=nl.sbuf, name="qT")
        nisa.dma_copy(dst=t, src=q.ap([[1, dp], [D, HQ]], offset=b * HQ * D + d0))
        tiles.append(t)
    return tiles


def _empty_request(out, lse, sinks, b, HQ, D):
    """No KV tokens: zeros, and LSE -inf (or log2 of the sink term alone)."""
    zeros = nl.ndarray((HQ, D), out.dtype, buffer=nl.sbuf, name="zeros")
    nisa.memset(dst=zeros, value=0.0)
    nisa.dma_copy(dst=out[b], src=zeros)
    l_sb = nl.ndarray((HQ, 1), nl.float32, buffer=nl.sbuf, name="lse_empty")
    if sinks is None:
        nisa.memset(dst=l_sb, value=float("-inf"))
    else:
        nisa.dma_copy(dst=l_sb, src=sinks)
        nisa.tensor_scalar(dst=l_sb, data=l_sb, op0=nl.multiply, operand0=LOG2E)
    nisa.dma_copy(dst=lse[b], src=l_sb)
