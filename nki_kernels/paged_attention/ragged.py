"""Ragged KV (FlashInfer ``BatchPrefillWithRaggedKVCacheWrapper``): keys and values of all
requests packed without paging, request b's in rows ``kv_indptr[b]:kv_indptr[b+1]`` of ``k`` /
``v`` [nnz, H, D], attended by ragged queries (``qo_indptr``).

The packed rows run through the paged kernel as a (k, v) pair of pages: with P the largest power
of two <= 128 dividing every offset of ``kv_indptr`` and the row count, ``k`` [nnz, H, D] is the
page array [nnz / P, P, H, D] (NHD, no copy) and request b owns pages kv_indptr[b] / P onward, so
a gather reads whole runs of P rows; one compile per (P, bucket).
"""

from __future__ import annotations

import numpy as np

from nki_kernels.paged_cache.checks import csr_counts, require_int32_vector

from .api import batch_prefill
from .checks import Q_DTYPES, check_qo_indptr
from .custom_mask import request_masks

MAX_PAGE = 128


def ragged_pages(kv_indptr, rows: int) -> int:
    """P: the largest power of two <= 128 dividing every offset of ``kv_indptr`` and ``rows``."""
    P = MAX_PAGE
    while P > 1 and (rows % P or (np.asarray(kv_indptr, np.int64) % P).any()):
        P //= 2
    return P


def ragged_page_table(kv_indptr, P: int):
    """(kv_indptr, kv_indices, kv_last_page_len) int32 of the packed rows seen as pages of P:
    request b's pages are kv_indptr[b] / P .. ceil(kv_indptr[b+1] / P)."""
    kv = kv_indptr.astype(np.int64)
    lens = np.diff(kv)
    first = kv[:-1] // P
    count = -(-lens // P)
    indptr = np.concatenate([[0], np.cumsum(count)]).astype(np.int32)
    indices = np.concatenate([np.arange(f, f + c) for f, c in zip(first, count)]
                             + [np.zeros(0, np.int64)]).astype(np.int32)
    last = np.where(lens > 0, lens - (count - 1) * P, 0).astype(np.int32)
    return indptr, indices, last


def check_ragged_kv(q, k, v, qo_indptr, kv_indptr):
    """The rules of the packed K/V beside the queries' (refused by name before any launch)."""
    for name, a in (("k", k), ("v", v)):
        if not isinstance(a, np.ndarray) or a.ndim != 3:
            raise ValueError(f"{name} must be a 3-D array [nnz, H, D], got "
                             f"{getattr(a, 'shape', type(a).__name__)}")
    if k.shape != v.shape or k.dtype != v.dtype:
        raise ValueError(f"k {k.shape} {k.dtype} and v {v.shape} {v.dtype} must match")
    if k.dtype.name not in Q_DTYPES:
        raise TypeError(f"k dtype {k.dtype} must be one of {Q_DTYPES}")
    require_int32_vector("kv_indptr", kv_indptr)
    if kv_indptr.shape[0] < 1:
        raise ValueError("kv_indptr must have batch + 1 >= 1 entries")
    csr_counts("kv_indptr", kv_indptr)
    if kv_indptr[-1] > k.shape[0]:
        raise ValueError(f"kv_indptr[-1]={kv_indptr[-1]} exceeds the {k.shape[0]} rows of k / v")
    if not isinstance(q, np.ndarray) or q.ndim != 3:
        raise ValueError(f"q must be a 3-D array [Q, HQ, D], got "
                         f"{getattr(q, 'shape', type(q).__name__)}")
    check_qo_indptr(qo_indptr, kv_indptr.shape[0] - 1, q.shape[0])


def batch_prefill_ragged(q, k, v, qo_indptr, kv_indptr, causal=False, sm_scale=None,
                         logits_soft_cap=0.0, window_left=-1, sinks=None, return_lse=False,
                         lnc=1, custom_mask=None, packed_custom_mask=None, mask_indptr=None):
    """Attention of ragged queries over ragged (unpaged) keys and values.

    Dimensions:  B requests, Q query tokens, N packed K/V rows, HQ / H query / kv heads, D
    Args:
        q: [Q, HQ, D] fp32 | fp16 | bf16; request b's tokens are rows qo_indptr[b]..[b+1]
        k, v: [N, H, D] in q's dtype family; request b's keys are rows kv_indptr[b]..[b+1]
        qo_indptr, kv_indptr: [B+1] int32 CSR offsets
        causal, sm_scale, logits_soft_cap, window_left, sinks, return_lse, lnc, custom_mask,
            packed_custom_mask, mask_indptr: as ``batch_prefill`` (causal: query i of q_len sees
            keys below kv_len - q_len + i + 1; a mask is [q_len, kv_len] per request)
    Returns out [Q, HQ, D] (and lse [Q, HQ] float32, base 2), equal to ``batch_prefill`` over a
    paged cache holding the same keys.
    """
    check_ragged_kv(q, k, v, qo_indptr, kv_indptr)
    rows = k.shape[0]
    P = ragged_pages(kv_indptr, rows)
    if rows == 0:                              # no keys anywhere: one empty page
        k = v = np.zeros((P, k.shape[1], k.shape[2]), k.dtype)
        rows = P
    pages = (np.ascontiguousarray(k).reshape(rows // P, P, k.shape[1], k.shape[2]),
             np.ascontiguousarray(v).reshape(rows // P, P, v.shape[1], v.shape[2]))
    table = ragged_page_table(kv_indptr, P)
    return batch_prefill(q, pages, qo_indptr, *table, "NHD", causal=causal, sm_scale=sm_scale,
                         logits_soft_cap=logits_soft_cap, window_left=window_left, sinks=sinks,
                         return_lse=return_lse, lnc=lnc, custom_mask=custom_mask,
                         packed_custom_mask=packed_custom_mask, mask_indptr=mask_indptr)


def batch_prefill_ragged_ref(q, k, v, qo_indptr, kv_indptr, causal=False, sm_scale=None,
                             logits_soft_cap=0.0, window_left=-1, sinks=None, return_lse=False,
                             custom_mask=None, packed_custom_mask=None, mask_indptr=None):
    """The float64 reference, written from FlashInfer's definition directly over the packed rows:
    query i of request b (q_len queries, kv_len keys) at position kv_len - q_len + i attends keys
    j < position + 1 (causal) or j < kv_len, and j >= position - window_left when
    window_left >= 0, and only keys its custom mask row keeps when a mask is given (instead of
    the causal bound); softmax of sm_scale * q . K[j] (soft-capped), sinks joining the
    denominator."""
    from .reference import LOG2E
    check_ragged_kv(q, k, v, qo_indptr, kv_indptr)
    Q, HQ, D = q.shape
    H = k.shape[1]
    if HQ % H:
        raise ValueError(f"num_qo_heads={HQ} must be a multiple of num_kv_heads={H}")
    scale = 1.0 / np.sqrt(D) if sm_scale is None else float(sm_scale)
    cap = 0.0 if logits_soft_cap is None else float(logits_soft_cap)
    masks = request_masks(custom_mask, packed_custom_mask, mask_indptr, np.diff(qo_indptr),
                          np.diff(kv_indptr))
    causal = causal and masks is None
    out = np.zeros((Q, HQ, D))
    lse = np.full((Q, HQ), -np.inf)
    for b in range(kv_indptr.shape[0] - 1):
        keys = k[kv_indptr[b]:kv_indptr[b + 1]].astype(np.float64)
        values = v[kv_indptr[b]:kv_indptr[b + 1]].astype(np.float64)
        L, n = keys.shape[0], int(qo_indptr[b + 1] - qo_indptr[b])
        if causal and n > L:
            raise ValueError(f"causal: request {b} has {n} queries but {L} keys")
        for i in range(n):
            t, pos = int(qo_indptr[b]) + i, L - n + i
            lo = max(0, pos - window_left) if window_left >= 0 else 0
            hi = pos + 1 if causal else L
            seen = np.arange(lo, hi) if masks is None else np.flatnonzero(masks[b][i, :hi]
                                                                         & (np.arange(hi) >= lo))
            for h in range(HQ):
                logits = keys[seen, h // (HQ // H)] @ q[t, h].astype(np.float64) * scale
                if cap > 0:
                    logits = cap * np.tanh(logits / cap)
                if sinks is not None:
                    logits = np.append(logits, float(sinks[h]))
                if logits.size == 0:
                    continue
                m = logits.max()
                p = np.exp(logits - m)
                out[t, h] = (p[:seen.size] / p.sum()) @ values[seen, h // (HQ // H)]
                lse[t, h] = (m + np.log(p.sum())) * LOG2E
    out = out.astype(q.dtype)
    return (out, lse.astype(np.float32)) if return_lse else out
