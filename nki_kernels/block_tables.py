"""Block-table entry points for the Trainium serving stacks' cache interface (vLLM-neuron,
NxD Inference), next to FlashInfer's CSR page table that the kernels take.

The tables (``block_tables``, ``seq_lens``, ``query_start_loc``) and their conversion to the CSR
page table live in ``paged_cache.block_tables``.

Cache forms: the stacks keep K and V on a leading axis, ``kv_cache (2, N, H, P, D)`` ("HND",
vLLM-neuron's and NxDI's) or ``(2, N, P, H, D)`` ("NHD"), or pass a (k_cache, v_cache) pair of
4-D arrays. (FlashInfer's fused ``[N, 2, ...]`` form goes to the CSR entries directly.)
NxDI's transposed K cache (``[N, H, D, P]``) is not supported yet.
"""

from __future__ import annotations

import numpy as np

from nki_kernels.paged_attention import (batch_decode, batch_decode_ref, batch_prefill,
                                         batch_prefill_ref)
from nki_kernels.paged_cache.block_tables import (append_tables, block_tables_to_csr,  # noqa: F401
                                                  caller_names, check_query_start_loc,
                                                  csr_to_block_tables, kv_pair)
from nki_kernels.paged_cache.layout import geometry
from nki_kernels.paged_kv_append import append_paged_kv_cache, append_paged_kv_cache_ref


def append_kv_with_block_tables(key, value, kv_cache, block_tables, seq_lens, query_start_loc,
                                kv_layout="HND", spare_page=None, lnc=1, k_scale=None,
                                v_scale=None):
    """Write each request's new K/V rows (the last q_len of its seq_lens tokens) into the cache.

    key, value: [T, H, D] in the cache dtype, request b's rows query_start_loc[b]..[b+1]
    (rows past query_start_loc[-1] are padding, not written); other arguments as the module
    says; ``spare_page``, ``lnc``, ``k_scale`` / ``v_scale`` (fp8 quantize on write) as
    ``append_paged_kv_cache``. Writes in place, or raises before writing anything.
    """
    pair = kv_pair(kv_cache)
    (indptr, indices, last), batch, positions = append_tables(
        block_tables, seq_lens, query_start_loc, geometry(pair, kv_layout), np.shape(key)[0])
    with caller_names():
        append_paged_kv_cache(key, value, batch, positions, pair, indices, indptr, last,
                              kv_layout, spare_page=spare_page, lnc=lnc, k_scale=k_scale,
                              v_scale=v_scale)


def attention_with_block_tables(q, kv_cache, block_tables, seq_lens, query_start_loc=None,
                                kv_layout="HND", causal=True, **options):
    """Attention of each request's query tokens over its pages.

    query_start_loc None: q [B, HQ, D], one token per request (decode, ``batch_decode``);
    else q [Q, HQ, D] ragged by query_start_loc (``batch_prefill``, ``causal`` as there).
    ``options``: sm_scale, logits_soft_cap, window_left, sinks, k_scale, v_scale, return_lse,
    lnc, and with query_start_loc append_key / append_value (the fused write) and a custom
    mask (custom_mask / packed_custom_mask / mask_indptr over [q_len, seq_len] per request, as
    ``batch_prefill``: tree attention with ``paged_attention.tree_mask``).
    """
    pair = kv_pair(kv_cache)
    geo = geometry(pair, kv_layout)
    indptr, indices, last = block_tables_to_csr(block_tables, seq_lens, geo.page_size,
                                                geo.num_pages)
    with caller_names():
        if query_start_loc is None:
            return batch_decode(q, pair, indptr, indices, last, kv_layout, **options)
        check_query_start_loc(query_start_loc, seq_lens)
        return batch_prefill(q, pair, query_start_loc, indptr, indices, last, kv_layout,
                             causal=causal, **options)


def append_kv_with_block_tables_ref(key, value, kv_cache, block_tables, seq_lens,
                                    query_start_loc, kv_layout="HND"):
    """The reference of ``append_kv_with_block_tables``: a copy of the cache (the same form:
    a (2, N, ...) array or a (k, v) pair) with each request's new rows written."""
    pair = kv_pair(kv_cache)
    (indptr, indices, last), batch, positions = append_tables(
        block_tables, seq_lens, query_start_loc, geometry(pair, kv_layout), np.shape(key)[0])
    k, v = append_paged_kv_cache_ref(key, value, batch, positions, pair, indices, indptr, last,
                                     kv_layout)
    return (k, v) if isinstance(kv_cache, (tuple, list)) else np.stack([k, v])


def attention_with_block_tables_ref(q, kv_cache, block_tables, seq_lens, query_start_loc=None,
                                    kv_layout="HND", causal=True, **options):
    """The float64 reference of ``attention_with_block_tables`` (``batch_decode_ref`` or
    ``batch_prefill_ref`` over the CSR table of the block tables); options as there, without
    the fused write."""
    pair = kv_pair(kv_cache)
    geo = geometry(pair, kv_layout)
    indptr, indices, last = block_tables_to_csr(block_tables, seq_lens, geo.page_size,
                                                geo.num_pages)
    if query_start_loc is None:
        return batch_decode_ref(q, pair, indptr, indices, last, kv_layout, **options)
    return batch_prefill_ref(q, pair, query_start_loc, indptr, indices, last, kv_layout,
                             causal=causal, **options)
