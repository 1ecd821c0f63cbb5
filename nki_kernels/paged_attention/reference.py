"""Float64 NumPy references of attention over a paged KV cache (FlashInfer semantics): one
batched decode step (``batch_decode_ref``) and ragged queries (``batch_prefill_ref``)."""

from __future__ import annotations

import numpy as np

from nki_kernels.paged_cache.layout import split_cache

from .checks import check_batch_decode_inputs, check_batch_prefill_inputs, soft_cap
from .custom_mask import request_masks

LOG2E = 1.0 / np.log(2.0)


def gather_kv(paged_kv_cache, kv_indptr, kv_indices, kv_len, b, page_size, kv_layout):
    """K, V of request b as float64 [kv_len, H, D] (pages in page-table order)."""
    k, v, _ = split_cache(paged_kv_cache)
    pages = kv_indices[kv_indptr[b]:kv_indptr[b + 1]]
    out = []
    for cache in (k, v):
        rows = cache[pages].astype(np.float64)                      # [n, P, H, D] or [n, H, P, D]
        if kv_layout == "HND":
            rows = rows.transpose(0, 2, 1, 3)
        out.append(rows.reshape(-1, rows.shape[2], rows.shape[3])[:kv_len])
    return out


def batch_decode_ref(q, paged_kv_cache, kv_indptr, kv_indices, kv_last_page_len, kv_layout="NHD",
                     sm_scale=None, logits_soft_cap=0.0, window_left=-1, sinks=None, k_scale=1.0,
                     v_scale=1.0, return_lse=False):
    """out[b, h] = v_scale * sum_j softmax_j(logit_j) V[j, h // G], logit_j = k_scale * sm_scale *
    q[b, h] . K[j, h // G], soft-capped as cap * tanh(logit / cap) when cap > 0, keys limited to the
    last window_left + 1 when window_left >= 0, and sinks[h] added to the softmax denominator;
    k_scale / v_scale: numbers, or arrays [H] taken per kv head h // G.

    Returns out [B, H_qo, D] in q's dtype, and with return_lse the base-2 log-sum-exp [B, H_qo]
    float32 (log2 of the softmax denominator, sink included). An empty request gives zeros and
    LSE -inf (or sinks[h] * log2(e) with sinks).
    """
    logits_soft_cap = soft_cap(logits_soft_cap)
    prob = check_batch_decode_inputs(q, paged_kv_cache, kv_indptr, kv_indices, kv_last_page_len,
                                     kv_layout, sm_scale, logits_soft_cap, window_left, sinks,
                                     k_scale, v_scale)
    B, HQ, D = q.shape
    out = np.zeros((B, HQ, D))
    lse = np.full((B, HQ), -np.inf)
    for b in range(B):
        L = int(prob.kv_lens[b])
        keys, values = gather_kv(paged_kv_cache, kv_indptr, kv_indices, L, b, prob.geo.page_size, kv_layout)
        start = max(0, L - 1 - window_left) if window_left >= 0 else 0
        keys, values = keys[start:], values[start:]
        for h in range(HQ):
            kvh = h // prob.group
            out[b, h], lse[b, h] = attend(q[b, h], keys[:, kvh], values[:, kvh],
                                          prob.sm_scale * head_scale(k_scale, kvh),
                                          logits_soft_cap, None if sinks is None else sinks[h],
                                          head_scale(v_scale, kvh))
    out = out.astype(q.dtype)
    return (out, lse.astype(np.float32)) if return_lse else out


def head_scale(scale, kv_head: int) -> float:
    """kv head ``kv_head``'s scale of a number (every head) or an array [H] (per kv head)."""
    return float(scale[kv_head]) if np.ndim(scale) else float(scale)


def attend(query, keys, values, scale, soft_cap, sink, v_scale):
    """One query's (out [D], base-2 lse) over keys/values [n, D] in float64: softmax of the
    (soft-capped) scaled logits, a sink logit joining the denominator only. No key and no sink:
    zeros and -inf."""
    logits = keys @ query.astype(np.float64) * scale
    if soft_cap > 0:
        logits = soft_cap * np.tanh(logits / soft_cap)
    if sink is not None:
        logits = np.append(logits, float(sink))
    if logits.size == 0:
        return np.zeros(values.shape[1]), -np.inf
    m = logits.max()
    p = np.exp(logits - m)
    denom = p.sum()
    return v_scale * (p[:keys.shape[0]] / denom) @ values, (m + np.log(denom)) * LOG2E


def batch_prefill_ref(q, paged_kv_cache, qo_indptr, kv_indptr, kv_indices, kv_last_page_len,
                      kv_layout="NHD", causal=False, sm_scale=None, logits_soft_cap=0.0,
                      window_left=-1, sinks=None, k_scale=1.0, v_scale=1.0, return_lse=False,
                      custom_mask=None, packed_custom_mask=None, mask_indptr=None):
    """out[t, h] for query token t = qo_indptr[b] + i of request b (q_len queries, kv_len keys):
    softmax over keys j with j < kv_len - q_len + i + 1 if causal (else j < kv_len) and
    j >= kv_len - q_len + i - window_left if window_left >= 0, of k_scale * sm_scale * q . K[j]
    (soft-capped), sinks[h] joining the denominator; times V[j] and v_scale. With a custom mask
    (``custom_mask.request_masks``: FlashInfer's flattened or bit-packed layout) the keys are
    those its row i keeps instead of the causal bound, the window still applying.

    Returns out [Q, HQ, D] in q's dtype and with return_lse lse [Q, HQ] float32 (base 2); a query
    that sees no key gives zeros and -inf (or the sink's term)."""
    logits_soft_cap = soft_cap(logits_soft_cap)
    masked = custom_mask is not None or packed_custom_mask is not None
    causal = bool(causal) and not masked
    prob, q_lens = check_batch_prefill_inputs(
        q, paged_kv_cache, qo_indptr, kv_indptr, kv_indices, kv_last_page_len, kv_layout, causal,
        sm_scale, logits_soft_cap, window_left, sinks, k_scale, v_scale)
    masks = request_masks(custom_mask, packed_custom_mask, mask_indptr, q_lens, prob.kv_lens)
    Q, HQ, D = q.shape
    out = np.zeros((Q, HQ, D))
    lse = np.full((Q, HQ), -np.inf)
    for b in range(prob.batch):
        L, n = int(prob.kv_lens[b]), int(q_lens[b])
        keys, values = gather_kv(paged_kv_cache, kv_indptr, kv_indices, L, b, prob.geo.page_size,
                                 kv_layout)
        for i in range(n):
            t, pos = int(qo_indptr[b]) + i, L - n + i
            hi = pos + 1 if causal else L
            lo = max(0, pos - window_left) if window_left >= 0 else 0
            seen = np.arange(lo, hi)
            if masks is not None:
                seen = seen[masks[b][i, lo:hi]]
            for h in range(HQ):
                kvh = h // prob.group
                out[t, h], lse[t, h] = attend(q[t, h], keys[seen, kvh], values[seen, kvh],
                                              prob.sm_scale * head_scale(k_scale, kvh),
                                              logits_soft_cap,
                                              None if sinks is None else sinks[h],
                                              head_scale(v_scale, kvh))
    out = out.astype(q.dtype)
    return (out, lse.astype(np.float32)) if return_lse else out
