"""Host-side page management FlashInfer leaves to users: a page allocator plus the CSR page table.

    cache = PagedKVCache(num_pages=64, page_size=16, num_kv_heads=8, head_dim=128)
    cache.add_request("a"); cache.add_request("b")
    cache.append(["a", "b"], keys, values, append_lens=[7, 1])   # reserve pages + kernel write
    kv_indptr, kv_indices, kv_last_page_len = cache.page_table(["a", "b"])
    cache.free_request("a")                                       # its pages return to the pool
"""

from __future__ import annotations

import numpy as np

from nki_kernels.paged_cache.batch_indices import get_batch_indices_positions
from nki_kernels.paged_cache.checks import require_count, require_counts
from nki_kernels.paged_cache.layout import CACHE_DTYPES, geometry

from .api import append_paged_kv_cache


class OutOfPages(RuntimeError):
    """The pool has fewer free pages than a reservation needs (nothing was reserved)."""


class PagedKVCache:
    """A paged KV cache [N, 2, P, H, D] (NHD) / [N, 2, H, P, D] (HND), or a (k, v) pair, with pages
    allocated per request; the page table it hands out is always consistent with what it stores."""

    def __init__(self, num_pages, page_size, num_kv_heads, head_dim, dtype=np.float32,
                 kv_layout="NHD", fused=True, fill=0.0):
        if kv_layout not in ("NHD", "HND"):
            raise ValueError(f"kv_layout={kv_layout!r} must be 'NHD' or 'HND'")
        num_pages, page_size, num_kv_heads, head_dim = (
            require_count(name, value, 1) for name, value in (
                ("num_pages", num_pages), ("page_size", page_size),
                ("num_kv_heads", num_kv_heads), ("head_dim", head_dim)))
        if np.dtype(dtype).name not in CACHE_DTYPES:
            raise TypeError(f"dtype={np.dtype(dtype).name} must be one of {CACHE_DTYPES} "
                            f"(the kernels' cache dtypes)")
        self.page_size, self.kv_layout = page_size, kv_layout
        inner = (page_size, num_kv_heads, head_dim) if kv_layout == "NHD" else (num_kv_heads, page_size, head_dim)
        if fused:
            self.data = np.full((num_pages, 2) + inner, fill, dtype=dtype)
        else:
            self.data = tuple(np.full((num_pages,) + inner, fill, dtype=dtype) for _ in range(2))
        self._free = list(range(num_pages - 1, -1, -1))        # pop() hands out low pages first
        self._pages, self._lens = {}, {}

    # -- requests -------------------------------------------------------------------------------
    def add_request(self, rid):
        if rid in self._pages:
            raise KeyError(f"request {rid!r} already exists")
        self._pages[rid], self._lens[rid] = [], 0

    def free_request(self, rid):
        """Forget request ``rid`` and return its pages to the pool."""
        self._known([rid])
        self._free.extend(reversed(self._pages.pop(rid)))
        del self._lens[rid]

    @property
    def num_free_pages(self) -> int:
        return len(self._free)

    def seq_len(self, rid) -> int:
        self._known([rid])
        return self._lens[rid]

    def pages(self, rid):
        self._known([rid])
        return list(self._pages[rid])

    def reserve(self, rids, num_new_tokens):
        """Grow each request by its count of tokens, allocating pages; all or nothing."""
        self._known(rids, unique=True)
        if isinstance(num_new_tokens, (int, np.integer)) and not isinstance(num_new_tokens, bool):
            num_new_tokens = [num_new_tokens] * len(rids)        # one count for every request
        counts = require_counts("num_new_tokens", num_new_tokens, len(rids), "one per rid")
        need = [max(0, -(-(self._lens[r] + int(n)) // self.page_size) - len(self._pages[r]))
                for r, n in zip(rids, counts)]
        if sum(need) > len(self._free):
            raise OutOfPages(f"need {sum(need)} pages, {len(self._free)} free")
        for r, n, k in zip(rids, counts, need):
            self._pages[r].extend(self._free.pop() for _ in range(k))
            self._lens[r] += int(n)

    def truncate(self, rid, new_len):
        """Shorten request ``rid`` to its first ``new_len`` tokens (e.g. rejected draft tokens of
        speculative decoding), returning pages past them to the pool; the rows stay as they are
        and are overwritten by the next append."""
        self._known([rid])
        new_len = require_count("new_len", new_len)
        if new_len > self._lens[rid]:
            raise ValueError(f"new_len={new_len} must be in [0, seq_len={self._lens[rid]}]")
        self._rollback([rid], [self._lens[rid] - int(new_len)])

    # -- FlashInfer page table ------------------------------------------------------------------
    def page_table(self, rids):
        """(kv_indptr [B+1], kv_indices [total pages], kv_last_page_len [B]) int32 for ``rids``."""
        self._known(rids)
        counts = [len(self._pages[r]) for r in rids]
        kv_indptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
        kv_indices = np.array([p for r in rids for p in self._pages[r]], np.int32)
        last = [(self._lens[r] - 1) % self.page_size + 1 if self._lens[r] else 0 for r in rids]
        return kv_indptr, kv_indices, np.array(last, np.int32)

    def append(self, rids, keys, values, append_lens, lnc=1):
        """Reserve room and write ragged K/V ([sum(append_lens), H, D]) for requests ``rids``
        (``lnc=2``: over both cores of a trn2 logical core). On any failure the reservation is
        rolled back: lengths and pages are as before the call."""
        self._known(rids, unique=True)
        append_lens = require_counts("append_lens", append_lens, len(rids), "one per rid")
        geo = geometry(self.data, self.kv_layout)
        for name, a in (("keys", keys), ("values", values)):   # before any page is reserved
            if not isinstance(a, np.ndarray) or a.ndim != 3 or \
                    a.shape[1:] != (geo.num_heads, geo.head_dim):
                raise ValueError(f"{name} shape {getattr(a, 'shape', type(a).__name__)} must be "
                                 f"[rows, {geo.num_heads}, {geo.head_dim}] (the cache's heads and "
                                 f"head_dim)")
        rows = keys.shape[0]
        if append_lens.sum() != rows:
            raise ValueError(f"append_lens {append_lens.tolist()} must sum to keys' {rows} rows")
        self.reserve(rids, append_lens)
        kv_indptr, kv_indices, last = self.page_table(rids)
        append_indptr = np.concatenate([[0], np.cumsum(append_lens)]).astype(np.int32)
        seq_lens = np.array([self._lens[r] for r in rids], np.int32)
        batch, positions = get_batch_indices_positions(append_indptr, seq_lens, keys.shape[0])
        try:
            append_paged_kv_cache(keys, values, batch, positions, self.data, kv_indices, kv_indptr,
                                  last, self.kv_layout, lnc=lnc)
        except BaseException:
            self._rollback(rids, append_lens)
            raise

    def _known(self, rids, unique=False):
        missing = [r for r in rids if r not in self._lens]
        if missing:
            raise KeyError(f"request {missing[0]!r} is not in the cache (add_request first; "
                           f"{len(self._lens)} known)")
        if unique and len(set(rids)) != len(rids):
            raise ValueError(f"rids {list(rids)} name a request twice")

    def _rollback(self, rids, append_lens):
        for r, n in zip(rids, append_lens):
            self._lens[r] -= int(n)
            keep = -(-self._lens[r] // self.page_size)
            self._free.extend(reversed(self._pages[r][keep:]))
            del self._pages[r][keep:]
