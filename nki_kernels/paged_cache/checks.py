"""Rules of the paged cache's tables, checked on the host before anything is written: index
arrays, CSR offsets, the page table (FlashInfer's kv_indptr / kv_indices / kv_last_page_len),
counts, and the slot each appended token goes to.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .layout import CacheGeometry


def require_int32_vector(name: str, a, length=None, why: str = ""):
    """``a`` is a 1-D int32 array (of ``length`` entries; ``why`` says where that length comes
    from in the refusal)."""
    if not isinstance(a, np.ndarray):
        raise TypeError(f"{name} must be a numpy int32 array, got {type(a).__name__}")
    if a.dtype != np.int32:
        raise TypeError(f"{name} dtype {a.dtype} must be int32 (int64 index arrays are refused, "
                        f"as in FlashInfer)")
    if a.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {a.shape}")
    if length is not None and a.shape[0] != length:
        raise ValueError(f"{name} has {a.shape[0]} entries, expected {length}"
                         + (f" ({why})" if why else ""))


def csr_counts(name: str, indptr) -> np.ndarray:
    """Each row's count (int64 [B]) from CSR offsets ``indptr`` [B+1], which must start at 0 and
    not decrease; a refusal names ``name``."""
    if indptr[0] != 0:
        raise ValueError(f"{name}[0]={indptr[0]} must be 0")
    counts = np.diff(indptr.astype(np.int64))
    if (counts < 0).any():
        b = int(np.flatnonzero(counts < 0)[0])
        raise ValueError(f"{name} must be non-decreasing: {name}[{b + 1}] < {name}[{b}]")
    return counts


class PageTable(NamedTuple):
    """A checked CSR page table (FlashInfer's): ``indptr`` [B+1], ``indices`` (request b's pages
    are indices[indptr[b]:indptr[b+1]]), ``last_page_len`` [B], all int32, and each request's
    KV length ``kv_lens`` [B] int64. The one value the plans pass around."""

    indptr: np.ndarray
    indices: np.ndarray
    last_page_len: np.ndarray
    kv_lens: np.ndarray

    @property
    def pages(self) -> int:
        """Pages the table lists (the used prefix of ``indices``)."""
        return int(self.indptr[-1])

    def requests(self, idx) -> "PageTable":
        """The table of requests ``idx`` (int array) alone, in that order."""
        p0, p1 = self.indptr[idx].astype(np.int64), self.indptr[idx + 1].astype(np.int64)
        pages = np.concatenate([self.indices[a:b] for a, b in zip(p0, p1)]
                               + [np.zeros(0, np.int32)]).astype(np.int32)
        indptr = np.concatenate([[0], np.cumsum(p1 - p0)]).astype(np.int32)
        return PageTable(indptr, pages, self.last_page_len[idx], self.kv_lens[idx])


def page_table(kv_indptr, kv_indices, kv_last_page_len, geo: CacheGeometry) -> PageTable:
    """The checked ``PageTable`` of FlashInfer's three arrays (``check_page_table``'s rules)."""
    kv_lens = check_page_table(kv_indices, kv_indptr, kv_last_page_len, geo)
    return PageTable(kv_indptr, kv_indices, kv_last_page_len, kv_lens)


def check_page_table(kv_indices, kv_indptr, kv_last_page_len, geo: CacheGeometry) -> np.ndarray:
    """Validate the CSR page table; returns each request's KV length (int64)."""
    pages = csr_counts("kv_indptr", kv_indptr)
    if kv_indptr[-1] > kv_indices.shape[0]:
        raise ValueError(f"kv_indptr[-1]={kv_indptr[-1]} exceeds len(kv_indices)={kv_indices.shape[0]}")
    used = kv_indices[:kv_indptr[-1]]
    bad = (used < 0) | (used >= geo.num_pages)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ValueError(f"kv_indices[{i}]={used[i]} is not a page of the cache (0..{geo.num_pages - 1})")
    return kv_lengths(pages, kv_last_page_len, geo.page_size)


def kv_lengths(pages, kv_last_page_len, page_size: int) -> np.ndarray:
    """Each request's KV length (int64) from its page count ``pages`` and ``kv_last_page_len``,
    which must be in [1, page_size] for a request with pages and 0 for one without."""
    last = kv_last_page_len.astype(np.int64)
    empty = pages == 0
    bad = np.where(empty, last != 0, (last < 1) | (last > page_size))
    if bad.any():
        b = int(np.flatnonzero(bad)[0])
        rule = "0 for a request with no pages" if empty[b] else f"in [1, page_size={page_size}]"
        raise ValueError(f"kv_last_page_len[{b}]={last[b]} must be {rule}")
    return np.where(empty, 0, (pages - 1) * page_size + last)


def require_count(name: str, value, low: int = 0) -> int:
    """An integer (Python or NumPy, not bool) >= ``low``, as int."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name}={value!r} must be an integer, got {type(value).__name__}")
    if value < low:
        raise ValueError(f"{name}={value} must be >= {low}")
    return int(value)


def require_counts(name: str, values, length: int, why: str = "") -> np.ndarray:
    """One integer >= 0 per entry (a sequence or an integer array of ``length``; ``why`` says
    where that length comes from), as int64 [length]."""
    if not isinstance(values, np.ndarray):
        values = list(values) if isinstance(values, (list, tuple, range)) else [values]
        bad = [v for v in values if isinstance(v, (bool, np.bool_))
               or not isinstance(v, (int, np.integer))]
        if bad:
            raise TypeError(f"{name} must hold integers, got {bad[0]!r}")
        values = np.array(values, np.int64).reshape(-1)
    elif values.dtype.kind not in "iu":
        raise TypeError(f"{name} must hold integers, got a {values.dtype} array")
    arr = values
    if arr.ndim != 1 or arr.shape[0] != length:
        raise ValueError(f"{name} has shape {arr.shape}; it must give one count per request "
                         f"({length}{', ' + why if why else ''})")
    if (arr < 0).any():
        i = int(np.flatnonzero(arr < 0)[0])
        raise ValueError(f"{name}[{i}]={arr[i]} must be >= 0")
    return arr.astype(np.int64)


def destination_slots(batch_indices, positions, kv_indices, kv_indptr, kv_lens, geo: CacheGeometry):
    """(page, entry, keep) of every appended token, refusing tokens outside what their request
    owns. A batch index of -1 marks a padding row (as ``get_batch_indices_positions`` leaves past
    ``append_indptr[-1]``): it is not written (``keep`` False; page and entry 0)."""
    batch = kv_indptr.shape[0] - 1
    b = batch_indices.astype(np.int64)
    keep = b != -1
    if ((b < -1) | (b >= batch)).any():
        i = int(np.flatnonzero((b < -1) | (b >= batch))[0])
        raise ValueError(f"batch_indices[{i}]={b[i]} is not a request index (0..{batch - 1}) "
                         f"or -1 (padding)")
    rows = np.flatnonzero(keep)                              # the rows that are written
    b, pos = b[rows], positions[rows].astype(np.int64)
    bad = (pos < 0) | (pos >= kv_lens[b])
    if bad.any():
        j = int(np.flatnonzero(bad)[0])
        raise ValueError(f"positions[{rows[j]}]={pos[j]} is outside request {b[j]}'s KV length "
                         f"{kv_lens[b[j]]} (its pages and kv_last_page_len must already cover "
                         f"the appended tokens)")
    flat = kv_indptr[b].astype(np.int64) * geo.page_size + pos
    pages, entries = np.zeros(keep.size, np.int64), np.zeros(keep.size, np.int64)
    pages[rows] = kv_indices[flat // geo.page_size]
    entries[rows] = flat % geo.page_size
    slots = pages[rows] * geo.page_size + entries[rows]
    if np.unique(slots).size != slots.size:
        raise ValueError("two appended tokens target the same cache slot (duplicate (batch, position) "
                         "pairs or pages shared between requests)")
    return pages, entries, keep
