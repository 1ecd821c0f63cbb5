"""``batch_decode``: host wrapper of the decode kernel (checks, plan, launch)."""

from __future__ import annotations

import numpy as np

from nki_kernels.paged_kv_append.layout import split_cache

from .checks import check_batch_decode_inputs
from .kernel import batch_decode_kernel
from .plan import make_plan


def _rows(a, D):
    return np.ascontiguousarray(a).reshape(-1, D)


def batch_decode(q, paged_kv_cache, kv_indptr, kv_indices, kv_last_page_len, kv_layout="NHD",
                 sm_scale=None, logits_soft_cap=0.0, window_left=-1, sinks=None, k_scale=1.0,
                 v_scale=1.0, return_lse=False):
    """One decode step of B requests over a paged KV cache (FlashInfer BatchDecode semantics).

    Dimensions:  B requests, HQ query heads, H kv heads (HQ % H == 0), D head_dim, P page_size
    Args:
        q: [B, HQ, D] fp32 | fp16 | bf16
        paged_kv_cache: [N, 2, P, H, D] (NHD) / [N, 2, H, P, D] (HND) or a (k, v) pair of 4-D
            arrays; fp32 | fp16 | bf16 | fp8 (e4m3fn, e5m2, e4m3) with ``k_scale``/``v_scale``
        kv_indptr [B+1], kv_indices, kv_last_page_len [B]: int32 CSR page table (FlashInfer)
        sm_scale: default 1/sqrt(D); logits_soft_cap: cap * tanh(logit / cap) if > 0;
        window_left: keep the last window_left + 1 keys (-1: all); sinks: [HQ] logits added to
        the softmax denominator only; k_scale scales logits, v_scale the output.
    Returns:
        out [B, HQ, D] in q's dtype; with return_lse also lse [B, HQ] float32, base 2 (log2 of the
        softmax denominator, as FlashInfer; multiply by ln 2 for natural log). Empty requests give
        zeros and -inf.
    """
    args, statics = prepare_decode(q, paged_kv_cache, kv_indptr, kv_indices, kv_last_page_len,
                                   kv_layout, sm_scale, logits_soft_cap, window_left, sinks, k_scale,
                                   v_scale)
    k, v, fused = split_cache(paged_kv_cache)
    D = q.shape[2]
    rows = (_rows(paged_kv_cache, D), None) if fused else (_rows(k, D), _rows(v, D))
    out, lse = batch_decode_kernel(q, *rows, *args, *statics)
    lse = lse.reshape(q.shape[0], q.shape[1])
    return (out, lse) if return_lse else out


def prepare_decode(q, paged_kv_cache, kv_indptr, kv_indices, kv_last_page_len, kv_layout, sm_scale,
                   logits_soft_cap, window_left, sinks, k_scale, v_scale):
    """Host half: validate, plan, and build the small index arrays the kernel reads.

    ``q``/``paged_kv_cache`` may be shape-and-dtype stand-ins (only their metadata is read); the
    index arrays must be host NumPy arrays. Returns (array args after the cache rows, static args).
    """
    prob = check_batch_decode_inputs(q, paged_kv_cache, kv_indptr, kv_indices, kv_last_page_len,
                                     kv_layout, sm_scale, logits_soft_cap, window_left, sinks,
                                     k_scale, v_scale)
    geo = prob.geo
    plan = make_plan(geo, prob.kv_lens, window_left)
    k_dtype = split_cache(paged_kv_cache)[0].dtype
    lens = prob.kv_lens.astype(np.int32).reshape(-1, 1)
    win = (np.maximum(0, prob.kv_lens - 1 - window_left) if window_left >= 0
           else np.zeros_like(prob.kv_lens)).astype(np.int32).reshape(-1, 1)
    padded = np.concatenate([kv_indices[:kv_indptr[-1]], np.zeros(plan.chunk, np.int32)]).reshape(-1, 1)
    mm_dtype = k_dtype.name if k_dtype.itemsize >= 2 else "bfloat16"
    sinks32 = None if sinks is None else np.asarray(sinks, np.float32).reshape(-1, 1)
    arrays = (kv_indptr.reshape(-1, 1), padded, lens, win, plan.token_table(geo.page_size), sinks32)
    statics = (geo.num_heads, geo.page_size, plan.chunks,
               (plan.rows_per_page, plan.entry_stride, plan.head_stride, plan.v_rows),
               prob.sm_scale * float(k_scale), float(logits_soft_cap), float(v_scale), mm_dtype)
    return arrays, statics
