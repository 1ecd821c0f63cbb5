"""Public entries of attention over a paged KV cache (FlashInfer semantics):
``batch_decode``, one query per request (BatchDecodeWithPagedKVCacheWrapper), and
``batch_prefill``, ragged queries (BatchPrefillWithPagedKVCacheWrapper: speculative
verification, chunked prefill, mixed batches, with an optional fused K/V write).

Each entry checks its arguments (``checks.py``), builds the launch plan (``plan.py``: work items,
buckets, device tables) and launches ``kernel.py``; ``reference.py`` holds the float64
references.
"""

from __future__ import annotations

import numpy as np

from nki_kernels.launch_options import check_lnc
from nki_kernels.paged_cache.layout import check_writable

from .checks import check_batch_prefill_inputs
from .custom_mask import request_masks
from .fused_write import append_arguments
from .head_scales import fold_head_scales, scale_heads
from .kernel import append_attention_kernel, batch_decode_kernel
from .plan import cache_rows, prefill_parts, prepare_decode, torch_index


def batch_decode(q, paged_kv_cache, kv_indptr, kv_indices, kv_last_page_len, kv_layout="NHD",
                 sm_scale=None, logits_soft_cap=0.0, window_left=-1, sinks=None, k_scale=1.0,
                 v_scale=1.0, return_lse=False, lnc=1):
    """One decode step of B requests over a paged KV cache (FlashInfer BatchDecode semantics).

    Dimensions:  B requests, HQ query heads, H kv heads (HQ % H == 0), D head_dim, P page_size
    Args:
        q: [B, HQ, D] fp32 | fp16 | bf16
        paged_kv_cache: [N, 2, P, H, D] (NHD) / [N, 2, H, P, D] (HND) or a (k, v) pair of 4-D
            arrays; fp32 | fp16 | bf16 | fp8 (e4m3fn, e5m2, e4m3) with ``k_scale``/``v_scale``
        kv_indptr [B+1], kv_indices, kv_last_page_len [B]: int32 CSR page table (FlashInfer)
        sm_scale: default 1/sqrt(D); logits_soft_cap: cap * tanh(logit / cap) if > 0;
        window_left: keep the last window_left + 1 keys (-1: all; any window_left >= kv_len - 1,
            up to any Python integer, keeps all of them); sinks: [HQ] logits added to
        the softmax denominator only; k_scale scales logits, v_scale the output (numbers, or
        float arrays [H] per kv head, folded into q and the output: ``head_scales.py``).
        lnc: 1, or 2 to share the step between the two cores of a trn2 logical core (LNC=2):
            the step's chunks are cut into two halves of equal work, whole requests on either
            side and the request at the cut split between the cores (split-KV, partial states
            merged on device), so a single long request uses both cores too.
    Returns:
        out [B, HQ, D] in q's dtype; with return_lse also lse [B, HQ] float32, base 2 (log2 of the
        softmax denominator, as FlashInfer; multiply by ln 2 for natural log). Empty requests give
        zeros and -inf. A request holds at most 2**24 - 1 keys. NaN and inf: docs/numerics.md.
    Compiles once per shape bucket (``nki_kernels.buckets``): the batch and the page-table length
    are padded to buckets, lengths reach the kernel as device data.
    """
    q, k_scale, v_scale, post = fold_head_scales(q, paged_kv_cache, kv_layout, k_scale, v_scale)
    launch = prepare_decode(q, paged_kv_cache, kv_indptr, kv_indices, kv_last_page_len, kv_layout,
                            sm_scale, logits_soft_cap, window_left, sinks, k_scale, v_scale,
                            check_lnc(lnc))
    out, lse = run_decode(launch, q, cache_rows(paged_kv_cache, q.shape[2]), lnc)
    out = scale_heads(out, post)
    return (out, lse) if return_lse else out


def run_decode(launch, q, kernel_rows, lnc=1, on_device=lambda a: a):
    """Run a planned decode step (``plan.prepare_decode``) on q [B, HQ, D], a NumPy array or a
    torch tensor (``on_device`` moves the plan's small arrays next to it): out [B, HQ, D], lse
    [B, HQ]. ``kernel_rows``: the cache as the kernel's (k_rows, v_rows)."""
    B, HQ, _ = q.shape
    kernel = batch_decode_kernel if lnc == 1 else batch_decode_kernel[lnc]
    out, lse = kernel(launch.pad_queries(q), *kernel_rows, *(on_device(a) for a in launch.arrays),
                      *launch.statics)
    return launch.unpad(out), launch.unpad(lse).reshape(B, HQ)


def batch_prefill(q, paged_kv_cache, qo_indptr, kv_indptr, kv_indices, kv_last_page_len,
                  kv_layout="NHD", causal=False, sm_scale=None, logits_soft_cap=0.0, window_left=-1,
                  sinks=None, k_scale=1.0, v_scale=1.0, return_lse=False, lnc=1, append_key=None,
                  append_value=None, custom_mask=None, packed_custom_mask=None, mask_indptr=None):
    """Attention of each request's new query tokens over its pages (the new tokens' K/V already
    appended: they are the request's last q_len keys).

    Dimensions:  B requests, Q = qo_indptr[-1] query tokens, HQ query heads, H kv heads, D head_dim
    Args:
        q: [Q, HQ, D] fp32 | fp16 | bf16; request b's tokens are rows qo_indptr[b]..qo_indptr[b+1]
        qo_indptr: [B+1] int32 CSR offsets of the query tokens (a request may have none)
        paged_kv_cache, kv_indptr, kv_indices, kv_last_page_len, kv_layout: as ``batch_decode``
        causal: query i of a request with q_len queries and kv_len keys sees keys below
            kv_len - q_len + i + 1 (needs kv_len >= q_len); False (FlashInfer's default): all keys
        window_left: >= 0 keeps keys at or after position kv_len - q_len + i - window_left
            (causal or not, as FlashInfer; any window_left >= kv_len - 1 keeps every key);
            sm_scale, logits_soft_cap, sinks, k_scale, v_scale,
            lnc: as ``batch_decode``
        append_key, append_value: [Q, H, D] in the cache dtype, or None: the new tokens' K/V,
            written into the cache (in place, as ``append_paged_kv_cache`` at each query token's
            position kv_len - q_len + i) by the same launch before attention reads them; wider
            rows into an fp8 cache are quantized on write with k_scale / v_scale (the scales
            attention reads back with; numbers or float arrays [H] per kv head)
        custom_mask: bool (or 0/1) [sum(q_len * kv_len)], each request's [q_len, kv_len] mask (True:
            the query sees the key) flattened row-major and concatenated (FlashInfer's layout),
            or None; packed_custom_mask: the same bit-packed per request (``segment_packbits``
            with bitorder="little"), uint8, taken over custom_mask when both are given;
            mask_indptr: int32 [B+1] byte offsets of the packed requests (default: back to
            back). A mask replaces ``causal`` (window_left still applies); a query whose keys
            are all masked gives zeros and LSE -inf. The bits are read on the device: one
            compile serves every mask of a bucket (``custom_mask.py``)
    Returns:
        out [Q, HQ, D] in q's dtype; with return_lse also lse [Q, HQ] float32, base 2. Masked
        scores are selected away, never added: a NaN or inf at a key a query does not see never
        reaches that query's output (docs/numerics.md gives the whole NaN semantics).
    Work items are blocks of Qb query tokens of one request (``query_block``: the largest q_len
    rounded up to a power of two while one tile of heads x group x Qb <= 128 score rows holds
    them, else as many such tiles of 128 // group tokens as it fills, up to 8), so each chunk of
    keys is read once for all of them; an item visits only the chunks its queries see.
    Compiles once per (Qb, bucket of work items); q_len == 1 everywhere is ``batch_decode``'s
    launch exactly. A mixed batch (some requests with one query, others with more) runs as two
    launches, the longer requests first (with the whole fused write), then the single queries as
    decode, each bucketed (``plan.prefill_parts``).
    """
    cores = check_lnc(lnc)
    write_scales = (k_scale, v_scale)
    q, k_scale, v_scale, post = fold_head_scales(q, paged_kv_cache, kv_layout, k_scale, v_scale)
    has_mask = custom_mask is not None or packed_custom_mask is not None
    prob, q_lens = check_batch_prefill_inputs(
        q, paged_kv_cache, qo_indptr, kv_indptr, kv_indices, kv_last_page_len, kv_layout,
        causal and not has_mask if isinstance(causal, (bool, np.bool_)) else causal, sm_scale, logits_soft_cap,
        window_left, sinks, k_scale, v_scale)
    masks = request_masks(custom_mask, packed_custom_mask, mask_indptr, q_lens, prob.kv_lens)
    writes = ()
    if append_key is not None or append_value is not None:
        arrays, write = append_arguments(append_key, append_value, paged_kv_cache, kv_layout,
                                         qo_indptr, kv_indptr, kv_indices, kv_last_page_len,
                                         prob.kv_lens, q.shape[0], *write_scales, lnc=lnc)
        writes = (*arrays, write)
        # every input is read before the write: q (read again by a mixed batch's second launch)
        # and sinks (read at the end of each item) are copied when they view the cache
        q, sinks = (None if a is None else check_writable(paged_kv_cache, (a,))[0]
                    for a in (q, sinks))
    parts = prefill_parts(prob, q_lens, qo_indptr, paged_kv_cache, causal,
                          logits_soft_cap, window_left, sinks, k_scale, v_scale, cores, masks)
    kernel_rows = cache_rows(paged_kv_cache, q.shape[2])
    out, lse = run_prefill(parts, q, kernel_rows, writes, lnc)
    out = scale_heads(out, post)
    return (out, lse) if return_lse else out


def run_prefill(parts, q, kernel_rows, writes, lnc=1, on_device=lambda a: a):
    """Run a prefill step's launches (``plan.prefill_parts``) on q, a NumPy array or a torch
    tensor (the device path: ``on_device`` moves the plan's small arrays next to q): out
    [Q, HQ, D] and lse [Q, HQ]. ``kernel_rows``: the cache as the kernel's (k_rows, v_rows);
    ``writes``: the fused write's kernel arguments, or ()."""
    if len(parts) == 1:
        return _run(parts[0].launch, q, kernel_rows, writes, lnc, on_device)
    if isinstance(q, np.ndarray):
        out, lse, index = np.empty(q.shape, q.dtype), np.empty(q.shape[:2], np.float32), None
    else:
        import torch
        out = q.new_empty(q.shape)
        lse = torch.empty(q.shape[:2], dtype=torch.float32, device=q.device)
        index = lambda rows: torch_index(rows, q.device)  # noqa: E731
    for part in parts:
        rows = part.rows if index is None else index(part.rows)
        out[rows], lse[rows] = _run(part.launch, q[rows], kernel_rows,
                                    writes if part.writes else (), lnc, on_device)
    return out, lse


def _run(launch, q, kernel_rows, writes, lnc, on_device):
    """One kernel launch of a prepared batch: out [Q, HQ, D], lse [Q, HQ]."""
    kernel = append_attention_kernel if writes else batch_decode_kernel
    kernel = kernel if lnc == 1 else kernel[lnc]
    out, lse = kernel(launch.pad_queries(q), *kernel_rows, *writes,
                      *(on_device(a) for a in launch.arrays), *launch.statics)
    return launch.unpad(out), launch.unpad(lse)[:, :, 0]
