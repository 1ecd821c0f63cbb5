"""Plain NumPy append_paged_kv_cache (FlashInfer semantics), one token at a time."""

from __future__ import annotations


from nki_kernels.paged_cache.checks import check_page_table, destination_slots
from nki_kernels.paged_cache.layout import split_cache

from .checks import check_append_shapes


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


def reshape_and_cache_ref(key, value, key_cache, value_cache, slot_mapping, kv_layout="NHD"):
    """Copies of the caches with token t's K/V at slot ``slot_mapping[t]`` = page * P + entry
    (a negative slot: not written), as ``reshape_and_cache`` writes them in place. Returns
    (key_cache, value_cache) copies, or one fused-cache copy when ``value_cache`` is None."""
    out = key_cache.copy() if value_cache is None else (key_cache.copy(), value_cache.copy())
    k, v, _ = split_cache(out)
    P = k.shape[1] if kv_layout == "NHD" else k.shape[2]
    for t, slot in enumerate(slot_mapping):
        if slot < 0:
            continue
        page, entry = divmod(int(slot), P)
        if kv_layout == "NHD":
            k[page, entry], v[page, entry] = key[t], value[t]
        else:
            k[page, :, entry], v[page, :, entry] = key[t], value[t]
    return out
