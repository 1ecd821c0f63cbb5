"""Input rules of append_paged_kv_cache, checked on the host before anything is written: the
rows' shapes and dtypes (``check_append_shapes``) and their quantization; the page table and
the destination slots are checked by ``paged_cache.checks``.
"""

from __future__ import annotations

import numpy as np

from nki_kernels.paged_cache.checks import check_page_table, destination_slots, require_int32_vector
from nki_kernels.paged_cache.layout import CacheGeometry, geometry, split_cache
from nki_kernels.paged_cache.quantize import quant_table


def check_append_shapes(append_key, append_value, batch_indices, positions, paged_kv_cache,
                        kv_indices, kv_indptr, kv_last_page_len, kv_layout,
                        quantize=False) -> CacheGeometry:
    """Shapes and dtypes of an append (rows in the cache dtype, or with ``quantize`` wider rows
    for an fp8 cache, checked by ``quantize.quant_table``)."""
    geo = geometry(paged_kv_cache, kv_layout)
    k_cache = split_cache(paged_kv_cache)[0]
    for name, a in (("append_key", append_key), ("append_value", append_value)):
        if not isinstance(a, np.ndarray) or a.ndim != 3:
            raise ValueError(f"{name} must be a 3-D array [nnz, H, D], got {getattr(a, 'shape', type(a).__name__)}")
        if a.shape[1:] != (geo.num_heads, geo.head_dim):
            raise ValueError(f"{name} shape {a.shape} must be [nnz, H={geo.num_heads}, D={geo.head_dim}] "
                             f"to match the cache")
        if a.dtype != k_cache.dtype and not quantize:
            hint = (" (pass k_scale and v_scale to quantize on write)"
                    if k_cache.dtype.name.startswith("float8") else "")
            raise TypeError(f"{name} dtype {a.dtype} must equal the cache dtype {k_cache.dtype}"
                            f"{hint}")
    if append_key.shape != append_value.shape:
        raise ValueError(f"append_key {append_key.shape} and append_value {append_value.shape} differ")
    nnz = append_key.shape[0]
    require_int32_vector("batch_indices", batch_indices, nnz)
    require_int32_vector("positions", positions, nnz)
    require_int32_vector("kv_indptr", kv_indptr)
    if kv_indptr.shape[0] < 1:
        raise ValueError("kv_indptr must have batch + 1 >= 1 entries")
    require_int32_vector("kv_last_page_len", kv_last_page_len, kv_indptr.shape[0] - 1)
    require_int32_vector("kv_indices", kv_indices)
    return geo


def check_append_rows(append_key, append_value, batch_indices, positions, paged_kv_cache,
                      kv_indices, kv_indptr, kv_last_page_len, kv_layout, k_scale=None,
                      v_scale=None):
    """``check_append_shapes`` plus the rows' quantization: (geo, (quant table, limit)) as
    ``quantize.quant_table`` gives it; scales None: the rows are in the cache dtype."""
    quantize = k_scale is not None or v_scale is not None
    geo = check_append_shapes(append_key, append_value, batch_indices, positions, paged_kv_cache,
                              kv_indices, kv_indptr, kv_last_page_len, kv_layout, quantize)
    quant = quant_table(k_scale, v_scale, split_cache(paged_kv_cache)[0].dtype,
                        {"append_key": append_key.dtype, "append_value": append_value.dtype},
                        geo.num_heads, geo.head_dim)
    return geo, quant


def check_spare_page(spare_page, geo: CacheGeometry, used_pages=None):
    if spare_page is None:
        return
    if not isinstance(spare_page, (int, np.integer)) or not 0 <= spare_page < geo.num_pages:
        raise ValueError(f"spare_page={spare_page!r} must be a page id in [0, {geo.num_pages})")
    if used_pages is not None and np.isin(spare_page, used_pages):
        raise ValueError(f"spare_page={spare_page} is one of the pages being written; the spare "
                         f"page must be reserved (owned by no request)")


def append_destinations(append_key, append_value, batch_indices, positions, paged_kv_cache,
                        kv_indices, kv_indptr, kv_last_page_len, kv_layout, k_scale=None,
                        v_scale=None, spare_page=None):
    """Every check of an append (rows, quantization, page table, destinations, spare page) and
    where its rows go: (geo, (quant table, limit), cache row of each token, keep: None when
    every token is written, else False for the padding rows). The arrays may be shape-and-dtype
    stand-ins (the torch device path); the index arrays are host NumPy arrays."""
    geo, quant = check_append_rows(append_key, append_value, batch_indices, positions,
                                   paged_kv_cache, kv_indices, kv_indptr, kv_last_page_len,
                                   kv_layout, k_scale, v_scale)
    lens = check_page_table(kv_indices, kv_indptr, kv_last_page_len, geo)
    check_spare_page(spare_page, geo, kv_indices[:kv_indptr[-1]])
    pages, entries, keep = destination_slots(batch_indices, positions, kv_indices, kv_indptr, lens,
                                             geo)
    return geo, quant, geo.rows(pages, entries), None if keep.all() else keep
