"""Plain NumPy append_paged_kv_cache (FlashInfer semantics), one token at a time."""

from __future__ import annotations


from .checks import check_append_shapes, check_page_table, destination_slots
from .layout import split_cache


def append_paged_kv_cache_ref(append_key, append_value, batch_indices, positions, paged_kv_cache,
                              kv_indices, kv_indptr, kv_last_page_len, kv_layout="NHD"):
    """Copies of the cache with token t's K/V written at page kv_indices[kv_indptr[b] + pos // P],
    entry pos % P (b = batch_indices[t], pos = positions[t]). Returns a 5-D array or a (k, v) tuple
    like ``paged_kv_cache``; the input is not modified."""
    geo = check_append_shapes(append_key, append_value, batch_indices, positions, paged_kv_cache,
                              kv_indices, kv_indptr, kv_last_page_len, kv_layout)
    lens = check_page_table(kv_indices, kv_indptr, kv_last_page_len, geo)
    keep = destination_slots(batch_indices, positions, kv_indices, kv_indptr, lens, geo)[2]
    out = paged_kv_cache.copy() if geo.fused else tuple(a.copy() for a in paged_kv_cache)
    k, v, _ = split_cache(out)
    for t, (b, pos) in enumerate(zip(batch_indices, positions)):
        if not keep[t]:                                  # batch -1: a padding row
            continue
        page = kv_indices[kv_indptr[b] + pos // geo.page_size]
        entry = pos % geo.page_size
        if kv_layout == "NHD":
            k[page, entry], v[page, entry] = append_key[t], append_value[t]        # [H, D]
        else:
            k[page, :, entry], v[page, :, entry] = append_key[t], append_value[t]
    return out
