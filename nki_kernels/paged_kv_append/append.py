"""``append_paged_kv_cache`` (FlashInfer) and ``reshape_and_cache`` (vLLM) over one device kernel."""

from __future__ import annotations

import numpy as np

from .checks import check_append_rows, check_page_table, destination_slots
from nki_kernels.buckets import bucket, pad_rows
from nki_kernels.launch_options import check_lnc

from nki_kernels.backend import nisa

from .kernel import P_MAX, SKIP_SLOT, packed_parts, paged_kv_scatter_kernel
from .layout import CacheGeometry, check_writable, geometry, row_views
from .quantize import quant_table


def packing(geo: CacheGeometry, tokens: int, quantized: bool = False, lnc: int = 1) -> int:
    """``parts`` for the kernel: > 0 when a bucket of ``tokens`` K/V rows of a fused cache goes
    out in one DMA (NeuronCore-v3+, one core, no quantization, K and V on <= 128 partitions;
    ``kernel.packed_parts``), else 0 (one DMA per K and per V)."""
    if not geo.fused or quantized or lnc != 1 or _host_nc_version() < 3:
        return 0
    return packed_parts(tokens, geo.num_heads)


def _host_nc_version() -> int:
    """The target's NeuronCore version as host code sees it (the simulator's selected target);
    0 where the backend cannot tell outside a kernel, which keeps the write unpacked (correct on
    every target)."""
    try:
        return int(nisa.get_nc_version())
    except Exception:                   # the Neuron SDK outside a kernel: unknown
        return 0


def padded_slots(rows, keep, geo: CacheGeometry, spare_page=None, quantized=False, lnc=1):
    """(slots, counts, parts) for a token bucket Tb = ``bucket_tokens(T)``: [Tb, 1] int32
    slots, or with ``parts`` > 0 (``packing``: the one place the write is packed or not) the
    packed write's [2 * Tb * parts, 1] destinations; the [1, 2] counts table (real tokens,
    128-token tiles). Skipped and padded tokens get SKIP_SLOT, or with ``spare_page`` a row of
    that page (entry t mod P), so nothing relies on ``oob_mode.skip`` (NxD Inference's way: the
    allocator reserves the page)."""
    T = int(rows.shape[0])
    Tb = bucket_tokens(T)
    real = np.asarray(rows, np.int64)
    if keep is not None:
        real = np.where(keep, real, -1)
    slots = np.full(Tb, -1, np.int64)
    slots[:T] = real
    dropped = slots < 0
    if spare_page is None:
        slots[dropped] = SKIP_SLOT
    else:
        entries = np.arange(Tb) % geo.page_size
        slots[dropped] = geo.rows(np.full(Tb, spare_page), entries)[dropped]
    counts = np.array([[T, -(-T // min(P_MAX, Tb))]], np.int32)
    parts = packing(geo, Tb, quantized, lnc)
    if parts:
        return geo.packed_slots(slots, parts, SKIP_SLOT), counts, parts
    return slots.astype(np.int32).reshape(-1, 1), counts, 0


def bucket_tokens(T: int) -> int:
    """The token bucket ``padded_slots`` pads T rows to."""
    Tb = bucket(T)
    return -(-Tb // P_MAX) * P_MAX if Tb > P_MAX else Tb


def check_spare_page(spare_page, geo: CacheGeometry, used_pages=None):
    if spare_page is None:
        return
    if not isinstance(spare_page, (int, np.integer)) or not 0 <= spare_page < geo.num_pages:
        raise ValueError(f"spare_page={spare_page!r} must be a page id in [0, {geo.num_pages})")
    if used_pages is not None and np.isin(spare_page, used_pages):
        raise ValueError(f"spare_page={spare_page} is one of the pages being written; the spare "
                         f"page must be reserved (owned by no request)")


def scatter_tokens(append_key, append_value, paged_kv_cache, geo: CacheGeometry, rows, keep=None,
                   spare_page=None, lnc=1, quant=(None, 0.0)):
    """Launch the device kernel for tokens whose first K row is ``rows`` (``keep`` False = skip);
    ``quant``: ``quantize.quant_table``'s (table, limit)."""
    if append_key.shape[0] == 0:
        return
    k_rows, v_rows = row_views(paged_kv_cache, geo)
    Tb = bucket_tokens(append_key.shape[0])
    slots, counts, parts = padded_slots(rows, keep, geo, spare_page, quant[0] is not None, lnc)
    kernel = paged_kv_scatter_kernel if lnc == 1 else paged_kv_scatter_kernel[lnc]
    kernel(k_rows, v_rows, pad_rows(append_key, Tb), pad_rows(append_value, Tb), slots, counts,
           geo.token_pattern, geo.v_offset, *quant, parts)


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
    geo, quant = check_append_rows(append_key, append_value, batch_indices, positions,
                                   paged_kv_cache, kv_indices, kv_indptr, kv_last_page_len,
                                   kv_layout, k_scale, v_scale)
    lens = check_page_table(kv_indices, kv_indptr, kv_last_page_len, geo)
    check_spare_page(spare_page, geo, kv_indices[:kv_indptr[-1]])
    check_lnc(lnc)
    append_key, append_value = check_writable(paged_kv_cache, (append_key, append_value))
    pages, entries, keep = destination_slots(batch_indices, positions, kv_indices, kv_indptr, lens,
                                             geo)
    scatter_tokens(append_key, append_value, paged_kv_cache, geo, geo.rows(pages, entries),
                   keep=None if keep.all() else keep, spare_page=spare_page, lnc=lnc, quant=quant)


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
