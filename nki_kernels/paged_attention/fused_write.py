"""Host half of the fused write of ``batch_prefill``: each query token's new K/V row goes to its
position in its request's pages, written by the attention launch before it reads them."""

from __future__ import annotations

import numpy as np

from nki_kernels.buckets import pad_rows
from nki_kernels.paged_cache.batch_indices import get_batch_indices_positions
from nki_kernels.paged_cache.layout import check_writable, split_cache
from nki_kernels.paged_cache.quantize import FP8_DTYPES
from nki_kernels.paged_kv_append.checks import append_destinations
from nki_kernels.paged_kv_append.plan import bucket_tokens, plan_append

from . import plan_cache


def append_plan(append_key, append_value, paged_kv_cache, kv_layout, qo_indptr, kv_indptr,
                kv_indices, kv_last_page_len, kv_lens, total_q, k_scale=1.0, v_scale=1.0, lnc=1):
    """``_append_plan``, made once for the layers of a step (``plan_cache``: the rows and the
    cache keyed by their shapes, dtypes and strides only)."""
    return plan_cache.reused(_append_plan, (append_key, append_value, paged_kv_cache, kv_layout,
                                            qo_indptr, kv_indptr, kv_indices, kv_last_page_len,
                                            kv_lens, total_q, k_scale, v_scale, lnc), (0, 1, 2))


def _append_plan(append_key, append_value, paged_kv_cache, kv_layout, qo_indptr, kv_indptr,
                 kv_indices, kv_last_page_len, kv_lens, total_q, k_scale=1.0, v_scale=1.0,
                 lnc=1):
    """Check the new rows; return the scatter's device tables (slots [Tb, 1], or the packed
    K+V write's destinations, ``paged_kv_append.plan.packing``; counts [1, 2]; quant [2, H*D]
    float32 or None) and its static ``write`` = (token pattern, V offset, cache row elements,
    quantization limit, packed parts); the rows are padded to ``bucket_tokens(total_q)``.

    append_key, append_value: [Q, H, D] (arrays or shape-and-dtype stand-ins) in the cache dtype,
    or wider rows for an fp8 cache, quantized on write with k_scale / v_scale (per tensor or
    per kv head, ``paged_cache.quantize``); row t is the K/V of query token t, which sits at
    position kv_len - q_len + i of its request (the page table already counts it).
    Writability is the caller's to check."""
    if (append_key is None) != (append_value is None):
        raise ValueError("append_key and append_value go together: give both or neither")
    q_lens = np.diff(qo_indptr.astype(np.int64))
    if (q_lens > kv_lens).any():
        b = int(np.flatnonzero(q_lens > kv_lens)[0])
        raise ValueError(f"append: request {b} writes {q_lens[b]} new tokens (qo_indptr) but its "
                         f"page table holds {kv_lens[b]} (kv_indptr / kv_last_page_len must count "
                         f"the new tokens)")
    for name, rows in (("append_key", append_key), ("append_value", append_value)):
        n = np.shape(rows)[0] if np.ndim(rows) else None
        if n != total_q:
            raise ValueError(f"{name} has {n} rows; it must have one per query token ({total_q})")
    batch, positions = get_batch_indices_positions(qo_indptr, kv_lens.astype(np.int32), total_q)
    cache_dtype = split_cache(paged_kv_cache)[0].dtype
    quantize = append_key.dtype != cache_dtype and cache_dtype.name in FP8_DTYPES
    geo, quant, rows, keep = append_destinations(
        append_key, append_value, batch, positions, paged_kv_cache, kv_indices, kv_indptr,
        kv_last_page_len, kv_layout, k_scale if quantize else None, v_scale if quantize else None)
    launch = plan_append(rows, keep, geo, quant, lnc=lnc)     # the append entry's own plan
    return launch.slots, launch.counts, launch.quant, (tuple(geo.token_pattern), geo.v_offset,
                                                       geo.row_elems, launch.limit, launch.parts)


def append_arguments(append_key, append_value, paged_kv_cache, *plan_args, lnc=1):
    """NumPy arrays: ``append_plan`` plus the writability and aliasing checks of the cache, and
    the rows padded to the slot bucket: ((key, value, slots, counts, quant), write)."""
    slots, counts, quant, write = append_plan(append_key, append_value, paged_kv_cache,
                                              *plan_args, lnc=lnc)
    key, value = check_writable(paged_kv_cache, (append_key, append_value))
    Tb = bucket_tokens(key.shape[0])
    return (pad_rows(key, Tb), pad_rows(value, Tb), slots, counts, quant), write
