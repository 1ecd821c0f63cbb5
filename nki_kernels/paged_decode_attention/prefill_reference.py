"""Float64 NumPy reference of ragged-query attention over a paged KV cache (FlashInfer
BatchPrefillWithPagedKVCacheWrapper semantics)."""

from __future__ import annotations

import numpy as np

from .checks import soft_cap
from .prefill import check_batch_prefill_inputs
from .reference import attend, gather_kv, head_scale


def batch_prefill_ref(q, paged_kv_cache, qo_indptr, kv_indptr, kv_indices, kv_last_page_len,
                      kv_layout="NHD", causal=False, sm_scale=None, logits_soft_cap=0.0,
                      window_left=-1, sinks=None, k_scale=1.0, v_scale=1.0, return_lse=False):
    """out[t, h] for query token t = qo_indptr[b] + i of request b (q_len queries, kv_len keys):
    softmax over keys j with j < kv_len - q_len + i + 1 if causal (else j < kv_len) and
    j >= kv_len - q_len + i - window_left if window_left >= 0, of k_scale * sm_scale * q . K[j]
    (soft-capped), sinks[h] joining the denominator; times V[j] and v_scale.

    Returns out [Q, HQ, D] in q's dtype and with return_lse lse [Q, HQ] float32 (base 2); a query
    that sees no key gives zeros and -inf (or the sink's term)."""
    logits_soft_cap = soft_cap(logits_soft_cap)
    prob, q_lens = check_batch_prefill_inputs(
        q, paged_kv_cache, qo_indptr, kv_indptr, kv_indices, kv_last_page_len, kv_layout, causal,
        sm_scale, logits_soft_cap, window_left, sinks, k_scale, v_scale)
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
            for h in range(HQ):
                kvh = h // prob.group
                out[t, h], lse[t, h] = attend(q[t, h], keys[lo:hi, kvh], values[lo:hi, kvh],
                                              prob.sm_scale * head_scale(k_scale, kvh),
                                              logits_soft_cap,
                                              None if sinks is None else sinks[h],
                                              head_scale(v_scale, kvh))
    out = out.astype(q.dtype)
    return (out, lse.astype(np.float32)) if return_lse else out
