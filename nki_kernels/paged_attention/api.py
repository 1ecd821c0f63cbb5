"""Public entries of attention over a paged KV cache (FlashInfer semantics):
``batch_decode``, one query per request (BatchDecodeWithPagedKVCacheWrapper), and
``batch_prefill``, ragged queries (BatchPrefillWithPagedKVCacheWrapper: speculative
verification, chunked prefill, mixed batches, with an optional fused K/V write).

Each entry checks its arguments (``checks.py``), builds the launch plan (``plan.py``: work items,
buckets, device tables) and launches ``kernel.py``; ``reference.py`` holds the float64
references.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from nki_kernels.launch_options import check_lnc
from nki_kernels.paged_cache.layout import check_writable

from .checks import check_batch_prefill_inputs
from .fused_write import append_arguments
from .head_scales import fold_head_scales, scale_heads
from .kernel import append_attention_kernel, batch_decode_kernel
from .plan import cache_rows, plan_prefill, prepare_decode


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
    B, HQ, D = q.shape
    kernel = batch_decode_kernel if lnc == 1 else batch_decode_kernel[lnc]
    out, lse = kernel(launch.pad_queries(q), *cache_rows(paged_kv_cache, D), *launch.arrays,
                      *launch.statics)
    out, lse = scale_heads(out[:B], post), lse[:B].reshape(B, HQ)
    return (out, lse) if return_lse else out


def batch_prefill(q, paged_kv_cache, qo_indptr, kv_indptr, kv_indices, kv_last_page_len,
                  kv_layout="NHD", causal=False, sm_scale=None, logits_soft_cap=0.0, window_left=-1,
                  sinks=None, k_scale=1.0, v_scale=1.0, return_lse=False, lnc=1, append_key=None,
                  append_value=None):
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
    Returns:
        out [Q, HQ, D] in q's dtype; with return_lse also lse [Q, HQ] float32, base 2. Masked
        scores are selected away, never added: a NaN or inf at a key a query does not see never
        reaches that query's output (docs/numerics.md gives the whole NaN semantics).
    Work items are blocks of Qb query tokens of one request (``query_block``: the largest q_len
    rounded up to a power of two while one tile of heads x group x Qb <= 128 score rows holds
    them, else up to 4 such tiles of 128 // group tokens), so each chunk of keys is read once for
    all of them; an item visits only the chunks its queries see.
    Compiles once per (Qb, bucket of work items); q_len == 1 everywhere is ``batch_decode``'s
    launch exactly. A mixed batch (some requests with one query, others with more) runs as two
    launches, the longer requests first (with the whole fused write), then the single queries as
    decode, each bucketed.
    """
    cores = check_lnc(lnc)
    write_scales = (k_scale, v_scale)
    q, k_scale, v_scale, post = fold_head_scales(q, paged_kv_cache, kv_layout, k_scale, v_scale)
    prob, q_lens = check_batch_prefill_inputs(
        q, paged_kv_cache, qo_indptr, kv_indptr, kv_indices, kv_last_page_len, kv_layout, causal,
        sm_scale, logits_soft_cap, window_left, sinks, k_scale, v_scale)
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
    options = (paged_kv_cache, bool(causal), logits_soft_cap, window_left, sinks, k_scale,
               v_scale, cores)
    single = q_lens == 1
    if not (single.any() and (q_lens > 1).any()):
        launch = plan_prefill(prob, q_lens, qo_indptr, kv_indptr, kv_indices, *options)
        out, lse = _run(launch, q, paged_kv_cache, writes, lnc)
        out = scale_heads(out, post)
        return (out, lse) if return_lse else out
    # A mixed batch: the requests with one query run as decode (Qb = 1) after the others, whose
    # launch also writes every new row: blocks of Qb rows would cost them Qb x the tiles. Both
    # launches are planned (everything checked) before the first runs.
    launches = []
    for group, group_writes in ((~single, writes), (single, ())):
        idx = np.flatnonzero(group)
        rows, (qo, ptr, pages) = _sub_batch(idx, qo_indptr, kv_indptr, kv_indices)
        sub = dataclasses.replace(prob, batch=idx.size, kv_lens=prob.kv_lens[idx])
        launches.append((rows, plan_prefill(sub, q_lens[idx], qo, ptr, pages, *options),
                         group_writes))
    out = np.empty(q.shape, q.dtype)
    lse = np.empty(q.shape[:2], np.float32)
    for rows, launch, group_writes in launches:
        out[rows], lse[rows] = _run(launch, q[rows], paged_kv_cache, group_writes, lnc)
    out = scale_heads(out, post)
    return (out, lse) if return_lse else out


def _run(launch, q, paged_kv_cache, writes, lnc):
    """One kernel launch of a prepared batch: out [Q, HQ, D], lse [Q, HQ]."""
    kernel = append_attention_kernel if writes else batch_decode_kernel
    kernel = kernel if lnc == 1 else kernel[lnc]
    out, lse = kernel(launch.pad_queries(q), *cache_rows(paged_kv_cache, q.shape[2]), *writes,
                      *launch.arrays, *launch.statics)
    return launch.unpad(out), launch.unpad(lse)[:, :, 0]


def _sub_batch(idx, qo_indptr, kv_indptr, kv_indices):
    """Requests ``idx`` as a batch of their own: (their q rows, (qo_indptr, kv_indptr,
    kv_indices) of that batch, int32)."""
    q0, q1 = qo_indptr[idx].astype(np.int64), qo_indptr[idx + 1].astype(np.int64)
    p0, p1 = kv_indptr[idx].astype(np.int64), kv_indptr[idx + 1].astype(np.int64)
    rows = np.concatenate([np.arange(a, b) for a, b in zip(q0, q1)] + [np.zeros(0, np.int64)])
    pages = np.concatenate([kv_indices[a:b] for a, b in zip(p0, p1)] + [np.zeros(0, np.int32)])
    indptr = lambda n: np.concatenate([[0], np.cumsum(n)]).astype(np.int32)  # noqa: E731
    return rows, (indptr(q1 - q0), indptr(p1 - p0), pages.astype(np.int32))
