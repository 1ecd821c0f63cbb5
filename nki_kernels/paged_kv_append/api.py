"""``append_paged_kv_cache`` (FlashInfer) and ``reshape_and_cache`` (vLLM) over one device kernel."""

from __future__ import annotations

import numpy as np

from nki_kernels.buckets import pad_rows
from nki_kernels.launch_options import check_lnc
from nki_kernels.paged_cache.layout import CacheGeometry, check_writable, geometry, row_views
from nki_kernels.paged_cache.quantize import quant_table

from .checks import append_destinations, check_spare_page
from .kernel import paged_kv_scatter_kernel
from .plan import plan_append


def scatter_tokens(append_key, append_value, paged_kv_cache, geo: CacheGeometry, rows, keep=None,
                   spare_page=None, lnc=1, quant=(None, 0.0)):
    """Launch the device kernel for tokens whose first K row is ``rows`` (``keep`` False = skip);
    ``quant``: ``quantize.quant_table``'s (table, limit)."""
    launch = plan_append(rows, keep, geo, quant, spare_page, lnc)
    launch_append(launch, append_key, append_value, *row_views(paged_kv_cache, geo), geo, lnc)


def launch_append(launch, key, value, k_rows, v_rows, geo: CacheGeometry, lnc=1,
                  on_device=lambda a: a):
    """Run one planned scatter (``plan.plan_append``) of ``key`` / ``value`` rows (NumPy arrays
    or torch tensors; ``on_device`` moves the plan's tables next to them) into the cache's
    (k_rows, v_rows); nothing for zero rows. Returns what the kernel returns."""
    if key.shape[0] == 0:
        return None
    kernel = paged_kv_scatter_kernel if lnc == 1 else paged_kv_scatter_kernel[lnc]
    return kernel(k_rows, v_rows, pad_rows(key, launch.tokens), pad_rows(value, launch.tokens),
                  on_device(launch.slots), on_device(launch.counts), geo.token_pattern,
                  geo.v_offset, on_device(launch.quant), launch.limit, launch.parts)


def append_paged_kv_cache(append_key, append_value, batch_indices, positions, paged_kv_cache,
                          kv_indices, kv_indptr, kv_last_page_len, kv_layout="NHD", spare_page=None,
                          lnc=1, k_scale=None, v_scale=None):
    """Append T ragged K/V rows into a paged cache in place (FlashInfer semantics).

    Dimensions:  T appended tokens, B requests, N pages, P page_size, H kv heads, D head_dim
    Args:
        append_key, append_value: [T, H, D], the cache's dtype
        batch_indices, positions: [T] int32: request and position (within the request's sequence,
            which already counts the appended tokens) of each row; see get_batch_indices_positions
            (batch -1: a padding row, not written)
        paged_kv_cache: [N, 2, P, H, D] (NHD) / [N, 2, H, P, D] (HND), or a (k, v) pair of 4-D
            [N, P, H, D] / [N, H, P, D]; C-contiguous; written in place
        kv_indices: [>= kv_indptr[-1]] int32 pages; kv_indptr: [B + 1] int32;
        kv_last_page_len: [B] int32 in [1, P] (0 for a request with no pages)
        spare_page: None (padding tokens of the shape bucket are dropped by ``oob_mode.skip``) or
            a reserved page id that no request owns (padding is written there instead)
        lnc: 1, or 2 on trn2 (LNC=2): one core writes K, the other V
        k_scale, v_scale: None (rows in the cache dtype), or quantize on write into an fp8
            cache: fp32/fp16/bf16 rows stored as rows / scale (a number, or float [H] per kv
            head), clamped to the fp8 range (``quantize.py``)
    Semantics:   page = kv_indices[kv_indptr[b] + pos // P], entry = pos % P.
    Notes:       every index is validated on the host first (nothing is written on bad input);
        the host then turns (batch, position) into cache rows (as vLLM's slot_mapping) and the
        device kernel scatters. Computing rows on device from a device-resident page table is the
        way to skip the host round trip; here validation needs the values on the host anyway.
    """
    geo, quant, rows, keep = append_destinations(
        append_key, append_value, batch_indices, positions, paged_kv_cache, kv_indices, kv_indptr,
        kv_last_page_len, kv_layout, k_scale, v_scale, spare_page)
    check_lnc(lnc)
    append_key, append_value = check_writable(paged_kv_cache, (append_key, append_value))
    scatter_tokens(append_key, append_value, paged_kv_cache, geo, rows, keep=keep,
                   spare_page=spare_page, lnc=lnc, quant=quant)


def reshape_and_cache(key, value, key_cache, value_cache, slot_mapping, kv_layout="NHD",
                      spare_page=None, lnc=1, k_scale=None, v_scale=None):
    """vLLM-style write: token t goes to slot_mapping[t] = block * block_size + offset.

    Args:
        key, value: [T, H, D]; key_cache, value_cache: [N, P, H, D] (NHD) / [N, H, P, D] (HND),
            or value_cache None and key_cache one fused [N, 2, P, H, D] / [N, 2, H, P, D] cache
        slot_mapping: [T] int32 or int64; a negative slot marks a padded token, which is skipped
            (``spare_page`` None) or written to the reserved page ``spare_page``.
        lnc: 1, or 2 on trn2 (LNC=2): one core writes K, the other V
        k_scale, v_scale: quantize on write into an fp8 cache, as ``append_paged_kv_cache``
    Raises ValueError for slots >= N * P or two tokens on one slot, before anything is written.
    """
    cache = key_cache if value_cache is None else (key_cache, value_cache)
    geo = geometry(cache, kv_layout)
    for name, a in (("key", key), ("value", value)):
        if not isinstance(a, np.ndarray) or a.shape[1:] != (geo.num_heads, geo.head_dim) or a.ndim != 3:
            raise ValueError(f"{name} shape {getattr(a, 'shape', None)} must be [T, {geo.num_heads}, {geo.head_dim}]")
        if a.dtype != key_cache.dtype and k_scale is None and v_scale is None:
            raise TypeError(f"{name} dtype {a.dtype} must equal the cache dtype {key_cache.dtype}")
    if key.shape != value.shape or key.dtype != value.dtype:
        raise ValueError(f"key {key.shape} {key.dtype} and value {value.shape} {value.dtype} differ")
    quant = quant_table(k_scale, v_scale, key_cache.dtype, {"key": key.dtype}, geo.num_heads, geo.head_dim)
    if not isinstance(slot_mapping, np.ndarray) or slot_mapping.dtype not in (np.int32, np.int64):
        raise TypeError("slot_mapping must be a numpy int32 or int64 array")
    if slot_mapping.shape != (key.shape[0],):
        raise ValueError(f"slot_mapping shape {slot_mapping.shape} must be ({key.shape[0]},)")
    slots = slot_mapping.astype(np.int64)
    keep = slots >= 0
    capacity = geo.num_pages * geo.page_size
    if (slots[keep] >= capacity).any():
        i = int(np.flatnonzero(keep & (slots >= capacity))[0])
        raise ValueError(f"slot_mapping[{i}]={slots[i]} exceeds the cache's {capacity} slots")
    if np.unique(slots[keep]).size != int(keep.sum()):
        raise ValueError("slot_mapping holds the same slot twice")
    pages, entries = np.divmod(np.where(keep, slots, 0), geo.page_size)
    check_spare_page(spare_page, geo, pages[keep])
    check_lnc(lnc)
    key, value = check_writable(cache, (key, value), ("key_cache", "value_cache"))
    scatter_tokens(key, value, cache, geo, geo.rows(pages, entries), keep, spare_page, lnc, quant)
