"""Paged KV cache layouts and the row addressing the append kernel scatters with.

Cache forms (FlashInfer): one 5-D tensor [N, 2, P, H, D] ("NHD") / [N, 2, H, P, D] ("HND") with
[:, 0] = K and [:, 1] = V, or a (k_cache, v_cache) pair of 4-D [N, P, H, D] / [N, H, P, D].

The kernel sees a cache as rows: NHD rows of H*D elements (a token's K or V is one row), HND rows of
D elements (a token's heads are H rows, P*D apart). A token at (page, entry) starts at row
``page * rows_per_page + entry``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

LAYOUTS = ("NHD", "HND")


@dataclass(frozen=True)
class CacheGeometry:
    num_pages: int
    page_size: int
    num_heads: int
    head_dim: int
    layout: str
    fused: bool                  # one 5-D tensor (True) or a (k, v) pair

    @property
    def row_elems(self) -> int:
        return self.num_heads * self.head_dim if self.layout == "NHD" else self.head_dim

    @property
    def rows_per_page(self) -> int:
        per_kv = self.page_size * (1 if self.layout == "NHD" else self.num_heads)
        return per_kv * (2 if self.fused else 1)

    @property
    def v_offset(self) -> int:
        """Elements from a page's K block to its V block in a fused cache."""
        return self.page_size * self.num_heads * self.head_dim

    def rows(self, pages: np.ndarray, entries: np.ndarray) -> np.ndarray:
        """First row of each token's K in the row view (int64)."""
        return pages.astype(np.int64) * self.rows_per_page + entries.astype(np.int64)


def split_cache(paged_kv_cache):
    """(k, v, fused): the K and V arrays (views of one 5-D array when fused)."""
    if isinstance(paged_kv_cache, (tuple, list)):
        if len(paged_kv_cache) != 2:
            raise ValueError(f"paged_kv_cache tuple must be (k_cache, v_cache), got {len(paged_kv_cache)} items")
        return paged_kv_cache[0], paged_kv_cache[1], False
    if not isinstance(paged_kv_cache, np.ndarray):
        raise TypeError(f"paged_kv_cache must be a numpy array or a (k, v) tuple, got {type(paged_kv_cache).__name__}")
    if paged_kv_cache.ndim != 5 or paged_kv_cache.shape[1] != 2:
        raise ValueError(f"paged_kv_cache shape {paged_kv_cache.shape} must be [N, 2, P, H, D] (NHD) "
                         f"or [N, 2, H, P, D] (HND)")
    return paged_kv_cache[:, 0], paged_kv_cache[:, 1], True


def geometry(paged_kv_cache, kv_layout: str) -> CacheGeometry:
    """Shape facts of a cache, validating the layout and that K and V agree."""
    if kv_layout not in LAYOUTS:
        raise ValueError(f"kv_layout={kv_layout!r} must be 'NHD' or 'HND'")
    k, v, fused = split_cache(paged_kv_cache)
    for name, a in (("k_cache", k), ("v_cache", v)):
        if not isinstance(a, np.ndarray) or a.ndim != 4:
            raise ValueError(f"{name} must be a 4-D array [N, P, H, D] ({kv_layout}), got "
                             f"{getattr(a, 'shape', type(a).__name__)}")
    if k.shape != v.shape or k.dtype != v.dtype:
        raise ValueError(f"k_cache {k.shape} {k.dtype} and v_cache {v.shape} {v.dtype} must match")
    n, a, b, d = k.shape
    page_size, heads = (a, b) if kv_layout == "NHD" else (b, a)
    return CacheGeometry(n, page_size, heads, d, kv_layout, fused)


def row_views(paged_kv_cache, geo: CacheGeometry):
    """(k_rows, v_rows) 2-D views [rows, row_elems] sharing the cache memory (v_rows is None when
    fused: V is k_rows shifted by ``geo.v_offset`` elements)."""
    if geo.fused:
        cache = paged_kv_cache
        if not cache.flags.c_contiguous:
            raise ValueError("paged_kv_cache must be C-contiguous to be updated in place")
        return cache.reshape(-1, geo.row_elems), None
    k, v = paged_kv_cache
    for name, a in (("k_cache", k), ("v_cache", v)):
        if not a.flags.c_contiguous:
            raise ValueError(f"{name} must be C-contiguous to be updated in place")
    return k.reshape(-1, geo.row_elems), v.reshape(-1, geo.row_elems)
