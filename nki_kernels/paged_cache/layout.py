"""Paged KV cache layouts and the row addressing the append kernel scatters with.

Cache forms (FlashInfer): one 5-D tensor [N, 2, P, H, D] ("NHD") / [N, 2, H, P, D] ("HND") with
[:, 0] = K and [:, 1] = V, or a (k_cache, v_cache) pair of 4-D [N, P, H, D] / [N, H, P, D].

Strides and token patterns come from ``access_patterns.PagedKVLayout``. The append kernel sees a
cache as rows of a token's first contiguous run: NHD rows of H*D elements (a token's K or V is one
row), HND rows of D elements (a token's heads are H rows, P*D apart): ``CacheGeometry.rows``.
The attention kernel sees rows of D elements: ``CacheGeometry.d_row_strides``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from nki_kernels.access_patterns import PagedKVLayout

LAYOUTS = ("NHD", "HND")


@dataclass(frozen=True)
class CacheGeometry(PagedKVLayout):
    """A cache's ``PagedKVLayout`` (strides and token patterns) plus the row view the append
    kernel addresses: rows of ``row_elems`` = a token's first contiguous run."""

    @property
    def row_elems(self) -> int:
        return self.token_run

    @property
    def d_row_strides(self) -> tuple:
        """(page, token entry, V offset) in rows of head_dim elements, the attention kernel's
        row view of the cache: token e of page p, head 0, starts at row p * page + e * entry
        (+ the V offset for V; 0 for a (k, v) pair)."""
        D = self.head_dim
        return (self.page_stride // D, self.entry_stride // D, self.v_offset // D)

    @property
    def token_pattern(self) -> tuple:
        """One token's K (or V) elements from its first, as ``(step, num)`` pairs for ``.ap``."""
        return tuple(self.token().pattern)

    def packed_slots(self, rows: np.ndarray, parts: int, skip: int) -> np.ndarray:
        """[2 * T * parts, 1] int32 destinations of the packed K+V write (``kernel.
        _scatter_packed``), in rows of D elements: entry (kv, t, j) is where part j (heads
        [j, j + 1) * H / parts) of token t's K (kv 0) / V (kv 1) starts; ``rows`` [T] are the
        tokens' K rows in the row view, ``skip`` marks (and stays) a token not written."""
        rows = np.asarray(rows, np.int64).reshape(-1)
        part = np.arange(parts, dtype=np.int64) * split_token_pattern(self.token_pattern, parts)[1]
        kv = np.array([0, self.v_offset], np.int64)
        elem = (kv[:, None, None] + rows[None, :, None] * self.row_elems + part[None, None, :])
        out = np.where((rows == skip)[None, :, None], skip, elem // self.head_dim)
        return out.reshape(-1, 1).astype(np.int32)

    def rows(self, pages: np.ndarray, entries: np.ndarray) -> np.ndarray:
        """First row of each token's K in the row view (int64)."""
        return (self.start(pages.astype(np.int64), entries.astype(np.int64)) // self.row_elems)


def split_token_pattern(token_pattern, parts):
    """A token's pattern cut into ``parts`` equal groups of its outermost dimension (heads, or
    the one run of all heads): (one part's ``(step, num)`` pairs, elements from one part's start
    to the next). Used by the packed write's kernel and its host-made destinations alike."""
    step, num = token_pattern[0]
    pattern = [[step, num // parts]]
    for pair in token_pattern[1:]:
        pattern.append(list(pair))
    return pattern, (num // parts) * step


CACHE_DTYPES = ("float32", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2", "float8_e4m3",
                "int8", "uint8", "int16", "uint16", "int32", "uint32")


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
    if k.dtype.name not in CACHE_DTYPES:
        raise TypeError(f"cache dtype {k.dtype} is not a NeuronCore element type (one of "
                        f"{', '.join(CACHE_DTYPES)}); convert the cache on the host")
    n, a, b, d = k.shape
    page_size, heads = (a, b) if kv_layout == "NHD" else (b, a)
    for what, size in (("page size", page_size), ("kv heads", heads), ("head_dim", d)):
        if size < 1:
            raise ValueError(f"cache shape {k.shape} ({kv_layout}) has {what} {size}: must be >= 1")
    return CacheGeometry(n, page_size, heads, d, kv_layout, fused)


def check_writable(paged_kv_cache, sources, names=("k_cache", "v_cache")):
    """Refuse a cache that cannot be updated in place (read-only, not C-contiguous, K and V
    overlapping) before anything is written; return ``sources`` (the rows to append) copied when
    they overlap the cache, so every input is read before the first write."""
    k, v, fused = split_cache(paged_kv_cache)
    arrays = ((("paged_kv_cache", paged_kv_cache),) if fused
              else ((names[0], k), (names[1], v)))
    for name, a in arrays:
        if not a.flags.writeable:
            raise ValueError(f"{name} is read-only; the cache is updated in place")
        if not a.flags.c_contiguous:
            raise ValueError(f"{name} must be C-contiguous to be updated in place")
    if not fused and np.shares_memory(k, v):
        raise ValueError(f"{names[0]} and {names[1]} share memory: V would overwrite K; pass two "
                         f"separate arrays (or one fused [N, 2, ...] cache)")
    cache = (paged_kv_cache,) if fused else (k, v)
    return tuple(src.copy() if any(np.may_share_memory(src, c) for c in cache) else src
                 for src in sources)


def row_views(paged_kv_cache, geo: CacheGeometry):
    """(k_rows, v_rows) 2-D views [rows, row_elems] sharing the cache memory (v_rows is None when
    fused: V is k_rows shifted by ``geo.v_offset`` elements); ``check_writable`` has made sure
    the cache is C-contiguous, so these are views, not copies."""
    if geo.fused:
        return paged_kv_cache.reshape(-1, geo.row_elems), None
    k, v = paged_kv_cache
    return k.reshape(-1, geo.row_elems), v.reshape(-1, geo.row_elems)
