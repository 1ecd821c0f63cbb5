"""``batch_decode``: host wrapper of the decode kernel (checks, request table, buckets, launch)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from nki_kernels.buckets import bucket, pad_rows
from nki_kernels.launch_options import check_lnc

from nki_kernels.paged_kv_append.layout import split_cache

from .checks import check_batch_decode_inputs, soft_cap
from .head_scales import fold_head_scales, scale_heads
from .kernel import batch_decode_kernel
from .plan import capacity_chunks, chunk_tokens, decode_work, make_layout


def cache_rows(paged_kv_cache, D):
    """The kernel's (k_rows, v_rows): the cache as rows of D elements [R, D] (v_rows None for a
    fused cache, whose V rows follow K's)."""
    k, v, fused = split_cache(paged_kv_cache)
    if fused:
        return np.ascontiguousarray(paged_kv_cache).reshape(-1, D), None
    return np.ascontiguousarray(k).reshape(-1, D), np.ascontiguousarray(v).reshape(-1, D)


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


@dataclass(frozen=True)
class DecodeLaunch:
    """What the host prepared: the kernel's array arguments after the cache rows, its static
    arguments, and the batch bucket."""

    arrays: tuple
    statics: tuple
    batch: int
    bucket: int

    def pad_queries(self, q):
        """q padded with zero rows to the batch bucket (a NumPy array, or a torch tensor)."""
        return pad_rows(q, self.bucket)


def prepare_decode(q, paged_kv_cache, kv_indptr, kv_indices, kv_last_page_len, kv_layout, sm_scale,
                   logits_soft_cap, window_left, sinks, k_scale, v_scale, cores=1) -> DecodeLaunch:
    """Host half: validate, and build the small index arrays the kernel reads, padded to buckets.

    ``q``/``paged_kv_cache`` may be shape-and-dtype stand-ins (only their metadata is read); the
    index arrays must be host NumPy arrays. Only shapes and model constants become static
    arguments; lengths and pages are device data.
    """
    logits_soft_cap = soft_cap(logits_soft_cap)
    prob = check_batch_decode_inputs(q, paged_kv_cache, kv_indptr, kv_indices, kv_last_page_len,
                                     kv_layout, sm_scale, logits_soft_cap, window_left, sinks,
                                     k_scale, v_scale)
    rows = bucket(prob.batch)
    work = decode_work(kv_indptr, prob.kv_lens, window_left, prob.geo.page_size, rows, cores,
                       capacity=table_capacity(prob.geo, kv_indptr))
    arrays, statics = kernel_arguments(prob, paged_kv_cache, kv_indptr, kv_indices, work, None,
                                       sinks, logits_soft_cap, k_scale, v_scale)
    return DecodeLaunch(arrays, statics, prob.batch, rows)


def page_table_rows(geo, kv_indptr) -> int:
    """Rows of the padded page list the kernel reads: the cache's pages or the bucket of the
    table's, whichever is more, plus a chunk of slack (a shape of the cache and the bucket)."""
    return max(geo.num_pages, bucket(int(kv_indptr[-1]))) + chunk_tokens(geo.page_size)


def table_capacity(geo, kv_indptr) -> int:
    """Chunks the padded page list can hold: sets the work-item table's static row count."""
    return capacity_chunks(page_table_rows(geo, kv_indptr), geo.page_size)


def kernel_arguments(prob, paged_kv_cache, kv_indptr, kv_indices, work, row_tab, sinks,
                     logits_soft_cap, k_scale, v_scale):
    """The kernel's array arguments after the cache rows (work tables, padded page list, token
    table, row table, sinks) and its static arguments, for checked inputs ``prob``."""
    geo = prob.geo
    layout = make_layout(geo)
    k_dtype = split_cache(paged_kv_cache)[0].dtype
    pages = int(kv_indptr[-1])
    padded = np.zeros((page_table_rows(geo, kv_indptr), 1), np.int32)
    padded[:pages, 0] = kv_indices[:pages]
    mm_dtype = k_dtype.name if k_dtype.itemsize >= 2 else "bfloat16"
    sinks32 = None if sinks is None else np.asarray(sinks, np.float32).reshape(-1, 1)
    arrays = (work.items, work.spans, padded, layout.token_table(geo.page_size), row_tab, sinks32)
    statics = (geo.num_heads, geo.page_size, layout.strides, tuple(geo.token().pattern),
               prob.sm_scale * float(k_scale),
               float(logits_soft_cap), float(v_scale), mm_dtype)
    return arrays, statics
