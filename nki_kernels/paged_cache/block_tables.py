"""The serving stacks' page tables beside FlashInfer's: block tables (vLLM-neuron, NxD
Inference) to the CSR page table and back, the stacks' cache forms, and the translation of a
CSR-level refusal into the block-table arguments the caller passed.

Block tables: ``block_tables [B, max_blocks]`` int32, row b listing request b's pages in order,
padded with -1; ``seq_lens [B]`` int32 keys per request (cached tokens plus the step's new ones);
``query_start_loc [B+1]`` int32 offsets of each request's new tokens in the packed rows (vLLM's
name; FlashInfer's ``qo_indptr``). Request b uses the first ceil(seq_lens[b] / P) entries of its
row; entries past them are ignored (they may be -1 or pages reserved ahead).
"""

from __future__ import annotations

import re
from contextlib import contextmanager

import numpy as np

from .batch_indices import get_batch_indices_positions
from .checks import csr_counts, kv_lengths, require_count, require_int32_vector


def block_tables_to_csr(block_tables, seq_lens, page_size, num_pages=None):
    """(kv_indptr [B+1], kv_indices, kv_last_page_len [B]) int32 of block tables; with
    ``num_pages`` (the cache's) every used entry must be a page of the cache."""
    page_size = require_count("page_size", page_size, 1)
    if not isinstance(block_tables, np.ndarray) or block_tables.ndim != 2 or block_tables.dtype != np.int32:
        raise TypeError(f"block_tables must be a 2-D int32 array [B, max_blocks], got "
                        f"{getattr(block_tables, 'dtype', type(block_tables).__name__)} "
                        f"{getattr(block_tables, 'shape', '')}")
    B, max_blocks = block_tables.shape
    require_int32_vector("seq_lens", seq_lens, B)
    if (seq_lens < 0).any():
        b = int(np.flatnonzero(seq_lens < 0)[0])
        raise ValueError(f"seq_lens[{b}]={seq_lens[b]} must be >= 0")
    need = -(-seq_lens.astype(np.int64) // page_size)
    if (need > max_blocks).any():
        b = int(np.flatnonzero(need > max_blocks)[0])
        raise ValueError(f"seq_lens[{b}]={seq_lens[b]} needs {need[b]} blocks of {page_size} but "
                         f"block_tables has {max_blocks} columns")
    used = np.arange(max_blocks)[None, :] < need[:, None]
    if (block_tables[used] < 0).any():
        b, j = (int(x[0]) for x in np.nonzero(used & (block_tables < 0)))
        raise ValueError(f"block_tables[{b}, {j}]={block_tables[b, j]}: request {b} needs its "
                         f"first {need[b]} entries ({seq_lens[b]} tokens); -1 may only pad "
                         f"past them")
    if num_pages is not None and (block_tables[used] >= num_pages).any():
        b, j = (int(x[0]) for x in np.nonzero(used & (block_tables >= num_pages)))
        raise ValueError(f"block_tables[{b}, {j}]={block_tables[b, j]} is not a page of the "
                         f"cache (0..{num_pages - 1})")
    indptr = np.concatenate([[0], np.cumsum(need)]).astype(np.int32)
    last = np.where(need > 0, seq_lens - (need - 1) * page_size, 0).astype(np.int32)
    return indptr, block_tables[used].astype(np.int32), last


def csr_to_block_tables(kv_indptr, kv_indices, kv_last_page_len, page_size, max_blocks=None):
    """(block_tables [B, max_blocks] int32 padded with -1, seq_lens [B] int32) of a CSR page
    table; ``max_blocks`` defaults to the longest request's page count. The table is checked
    as the kernels check it (page ids >= 0, kv_last_page_len in [1, page_size], 0 for a
    request without pages)."""
    page_size = require_count("page_size", page_size, 1)
    require_int32_vector("kv_indptr", kv_indptr, None)
    if kv_indptr.shape[0] < 1:
        raise ValueError("kv_indptr must have batch + 1 >= 1 entries")
    counts = csr_counts("kv_indptr", kv_indptr)
    B = counts.size
    require_int32_vector("kv_last_page_len", kv_last_page_len, B, "batch: kv_indptr has B + 1")
    require_int32_vector("kv_indices", kv_indices, None)
    if kv_indices.size < kv_indptr[-1]:
        raise ValueError(f"kv_indices has {kv_indices.size} entries but kv_indptr[-1]={kv_indptr[-1]}")
    used = kv_indices[:kv_indptr[-1]]
    if (used < 0).any():
        i = int(np.flatnonzero(used < 0)[0])
        raise ValueError(f"kv_indices[{i}]={used[i]} is not a page id (ids are >= 0)")
    seq_lens = kv_lengths(counts, kv_last_page_len, page_size)
    if seq_lens.max(initial=0) > np.iinfo(np.int32).max:
        raise ValueError("a request's length exceeds int32 (seq_lens is int32)")
    width = (int(counts.max(initial=0)) if max_blocks is None
             else require_count("max_blocks", max_blocks))
    if (counts > width).any():
        b = int(np.flatnonzero(counts > width)[0])
        raise ValueError(f"request {b} has {counts[b]} pages but max_blocks={width}")
    tables = np.full((B, width), -1, np.int32)
    for b in range(B):
        tables[b, :counts[b]] = kv_indices[kv_indptr[b]:kv_indptr[b + 1]]
    return tables, seq_lens.astype(np.int32)


# How the CSR entries' refusals name what a block-table caller passed as something else
_CALLER_NAMES = ((r"\bqo_indptr\b", "query_start_loc"), (r"\bappend_indptr\b", "query_start_loc"),
                 (r"\(kv_indptr / kv_last_page_len\)", "(seq_lens)"),
                 (r"kv_indptr / kv_last_page_len", "seq_lens"),
                 (r"\bnnz=(\d+)", r"the \1 rows of key"))


@contextmanager
def caller_names():
    """Refusals raised inside (ValueError, TypeError) name the block-table arguments
    (query_start_loc, seq_lens, ...) instead of the CSR ones built from them; a batch-size
    mismatch is said in rows of block_tables."""
    try:
        yield
    except (ValueError, TypeError) as e:
        msg = str(e)
        new = re.sub(r"kv_indptr has (\d+) entries, expected (\d+)",
                     lambda m: f"block_tables / seq_lens have {int(m[1]) - 1} rows, expected "
                               f"{int(m[2]) - 1}", msg)
        for pattern, name in _CALLER_NAMES:
            new = re.sub(pattern, name, new)
        if new == msg:
            raise
        raise type(e)(new) from e


def kv_pair(kv_cache):
    """(k_cache, v_cache) of a serving stack's cache: a (2, N, ...) array or a (k, v) pair."""
    if isinstance(kv_cache, (tuple, list)):
        if len(kv_cache) != 2 or any(not isinstance(a, np.ndarray) or a.ndim != 4 for a in kv_cache):
            raise ValueError("a kv_cache pair must be (k_cache, v_cache): two 4-D arrays "
                             "[N, H, P, D] (HND) / [N, P, H, D] (NHD)")
        return tuple(kv_cache)
    if not isinstance(kv_cache, np.ndarray) or kv_cache.ndim != 5 or kv_cache.shape[0] != 2:
        raise ValueError(f"kv_cache shape {getattr(kv_cache, 'shape', None)} must be (2, N, H, P, D) "
                         f"(HND) / (2, N, P, H, D) (NHD), or pass a (k_cache, v_cache) pair")
    return kv_cache[0], kv_cache[1]


def append_tables(block_tables, seq_lens, query_start_loc, geo, rows):
    """What an append of ``rows`` packed K/V rows needs from the block tables, checked: the CSR
    table (kv_indptr, kv_indices, kv_last_page_len) and each row's (batch, position). ``geo``:
    the cache's geometry."""
    csr = block_tables_to_csr(block_tables, seq_lens, geo.page_size, geo.num_pages)
    new = check_query_start_loc(query_start_loc, seq_lens)
    if query_start_loc[-1] > rows:
        raise ValueError(f"query_start_loc[-1]={query_start_loc[-1]} exceeds the {rows} rows of "
                         f"key / value")
    if (new > seq_lens).any():
        b = int(np.flatnonzero(new > seq_lens)[0])
        raise ValueError(f"request {b} has {new[b]} new tokens (query_start_loc) but "
                         f"seq_lens[{b}]={seq_lens[b]}: seq_lens counts the new tokens too")
    return (csr,) + get_batch_indices_positions(query_start_loc, seq_lens, rows)


def check_query_start_loc(query_start_loc, seq_lens) -> np.ndarray:
    """int64 [B] new tokens per request from ``query_start_loc`` [B+1] (seq_lens: [B])."""
    require_int32_vector("query_start_loc", query_start_loc, seq_lens.size + 1,
                         "batch + 1: seq_lens has one entry per request")
    return csr_counts("query_start_loc", query_start_loc)
