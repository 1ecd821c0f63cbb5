"""Property-based fuzzing of the cache writes (``append_paged_kv_cache``, ``reshape_and_cache``,
``append_kv_with_block_tables``) on trn1 and trn2: a valid call writes exactly what the reference
writes and not a byte more; an invalid one is refused by name with every input bit-identical."""

import numpy as np
import pytest
from hypothesis import strategies as st

from nki_kernels.block_tables import append_kv_with_block_tables, csr_to_block_tables
from nki_kernels.paged_kv_append import (append_paged_kv_cache, append_paged_kv_cache_ref,
                                         reshape_and_cache)

from .cases import (BUDGETS, append_args, append_cases, assert_refused, bits, corrupted,
                    fused_view, on_target, run, written_mask)


def _check_written(c, got):
    """``got`` equals the reference run on the inputs as they were before the call (appended
    rows that view the cache are read before anything is written), and nothing outside the
    slots the FlashInfer rule names changed."""
    want = fused_view(append_paged_kv_cache_ref(*append_args(
        dict(c, cache=c["original"], key=c["key_before"], value=c["value_before"]))))
    got, before = fused_view(got), fused_view(c["original"])
    assert np.array_equal(bits(got), bits(want)), "cache differs from the reference"
    outside = ~written_mask(c)
    assert np.array_equal(got[outside].view(np.uint8), before[outside].view(np.uint8)), \
        "a byte outside the write set changed"


def _with_original(c):
    cache = c["cache"]
    c["original"] = cache.copy() if isinstance(cache, np.ndarray) else tuple(a.copy() for a in cache)
    c["key_before"], c["value_before"] = c["key"].copy(), c["value"].copy()
    return c


@pytest.mark.parametrize("budget", BUDGETS)
def test_append_writes_exactly_the_reference_slots(budget):
    def prop(c):
        _with_original(c)
        with on_target(c):
            append_paged_kv_cache(*append_args(c), lnc=c["lnc"])
        _check_written(c, c["cache"])
    run(prop, append_cases(), 60, budget)


@pytest.mark.parametrize("budget", BUDGETS)
def test_padding_rows_go_to_the_spare_page_and_nowhere_else(budget):
    """``spare_page``: padding rows are written to a page no request owns; every other byte is
    as the reference (which skips them) has it."""
    def prop(c):
        owned = set(c["kv_indices"][:c["kv_indptr"][-1]].tolist())
        spare = next(p for p in range(c["num_pages"]) if p not in owned)
        _with_original(c)
        with on_target(c):
            append_paged_kv_cache(*append_args(c), spare_page=spare, lnc=c["lnc"])
        keep = np.ones(c["num_pages"], bool)
        keep[spare] = False
        c = dict(c, num_pages=c["num_pages"] - 1, kv_indices=_renumbered(c["kv_indices"], spare),
                 cache=_without_page(c["cache"], spare),
                 original=_without_page(c["original"], spare))
        _check_written(c, c["cache"])
    run(prop, append_cases(), 30, budget)


def _without_page(cache, page):
    drop = lambda a: np.delete(a, page, axis=0)     # noqa: E731
    return drop(cache) if isinstance(cache, np.ndarray) else tuple(drop(a) for a in cache)


def _renumbered(indices, removed):
    """Page ids once page ``removed`` is taken out of the cache (ids above it shift down)."""
    return np.where(indices > removed, indices - 1, indices).astype(np.int32)


def slot_mapping(c):
    """vLLM's slot per row: page * P + entry, -1 for padding rows."""
    P = c["page_size"]
    b, pos = c["batch_indices"], c["positions"]
    slots = np.full(b.shape, -1, np.int64)
    keep = b >= 0
    pages = c["kv_indices"][c["kv_indptr"][b[keep]] + pos[keep] // P]
    slots[keep] = pages * P + pos[keep] % P
    return slots


@pytest.mark.parametrize("budget", BUDGETS)
def test_reshape_and_cache_writes_what_append_writes(budget):
    def prop(c):
        _with_original(c)
        cache = c["cache"]
        k_cache, v_cache = (cache, None) if c["fused"] else cache
        with on_target(c):
            reshape_and_cache(c["key"], c["value"], k_cache, v_cache, slot_mapping(c),
                              c["layout"], lnc=c["lnc"])
        _check_written(c, cache)
    run(prop, append_cases(), 40, budget)


@st.composite
def sorted_append_cases(draw):
    """Rows grouped by request in order (the block-table entry's ``query_start_loc`` form)."""
    c = draw(append_cases())
    keep = c["batch_indices"] >= 0
    order = np.lexsort((c["positions"], np.where(keep, c["batch_indices"], 1 << 30)))
    for name in ("key", "value", "batch_indices", "positions"):
        c[name] = c[name][order]
    c["fused"] = False
    c["cache"] = tuple(np.ascontiguousarray(x) for x in (c["cache"][:, 0], c["cache"][:, 1])) \
        if isinstance(c["cache"], np.ndarray) else c["cache"]
    return c


def block_table_args(c):
    """(block_tables, seq_lens, query_start_loc) of a sorted case, as vLLM-neuron passes them."""
    B = c["kv_last_page_len"].size
    counts = np.bincount(c["batch_indices"][c["batch_indices"] >= 0], minlength=B)
    qsl = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    tables, seq_lens = csr_to_block_tables(c["kv_indptr"], c["kv_indices"],
                                           c["kv_last_page_len"], c["page_size"])
    assert np.array_equal(seq_lens, c["lens"])
    return tables, seq_lens, qsl


@pytest.mark.parametrize("budget", BUDGETS)
def test_block_table_append_writes_what_append_writes(budget):
    def prop(c):
        _with_original(c)
        tables, seq_lens, qsl = block_table_args(c)
        with on_target(c):
            append_kv_with_block_tables(c["key"], c["value"], c["cache"], tables, seq_lens, qsl,
                                        c["layout"])
        _check_written(c, c["cache"])
    run(prop, sorted_append_cases(), 30, budget)


# ---- invalid calls: one corruption of a valid case each --------------------------------------

def _a_row(c):
    rows = np.flatnonzero(c["batch_indices"] >= 0)
    return int(rows[0]) if rows.size else None


def corrupt(c, kind):
    """Apply corruption ``kind`` to case ``c`` in place; return the text the refusal must hold,
    or None when the case cannot take that corruption."""
    B, P, N = c["kv_last_page_len"].size, c["page_size"], c["num_pages"]
    row = _a_row(c)
    if kind == "position past the length" and row is not None:
        c["positions"] = c["positions"].copy()
        c["positions"][row] = c["lens"][c["batch_indices"][row]]
        return "positions"
    if kind == "request out of range" and c["batch_indices"].size:
        c["batch_indices"] = c["batch_indices"].copy()
        c["batch_indices"][0] = B
        return "batch_indices"
    if kind == "negative request other than -1" and c["batch_indices"].size:
        c["batch_indices"] = c["batch_indices"].copy()
        c["batch_indices"][-1] = -2
        return "batch_indices"
    if kind == "page id past the cache" and c["kv_indptr"][-1] > 0:
        c["kv_indices"] = c["kv_indices"].copy()
        c["kv_indices"][int(c["kv_indptr"][-1]) - 1] = N
        return "kv_indices"
    if kind == "negative page id" and c["kv_indptr"][-1] > 0:
        c["kv_indices"] = c["kv_indices"].copy()
        c["kv_indices"][0] = -1
        return "kv_indices"
    if kind == "indptr decreasing" and B >= 2 and c["kv_indptr"][1] > 0:
        c["kv_indptr"] = c["kv_indptr"].copy()
        c["kv_indptr"][1] = c["kv_indptr"][2] + 1
        return "kv_indptr"
    if kind == "last page too long" and (c["lens"] > 0).any():
        b = int(np.flatnonzero(c["lens"] > 0)[0])
        c["kv_last_page_len"] = c["kv_last_page_len"].copy()
        c["kv_last_page_len"][b] = P + 1
        return "kv_last_page_len"
    if kind == "key dtype differs":
        c["key"] = c["key"].astype(np.float64)
        return "append_key"
    if kind == "value shape differs":
        c["value"] = np.zeros(c["value"].shape[:2] + (c["D"] + 1,), c["value"].dtype)
        return "append_value"
    if kind == "int64 positions":
        c["positions"] = c["positions"].astype(np.int64)
        return "positions"
    if kind == "read-only cache":
        (c["cache"] if c["fused"] else c["cache"][1]).flags.writeable = False
        return "read-only"
    if kind == "k and v caches are one array" and not c["fused"]:
        c["cache"] = (c["cache"][0], c["cache"][0])
        return "share memory"
    if kind == "two rows on one slot" and row is not None and c["batch_indices"].size > 1:
        other = 1 if row == 0 else 0
        for name in ("batch_indices", "positions"):
            c[name] = c[name].copy()
            c[name][other] = c[name][row]
        return "same cache slot"
    if kind == "unknown layout":
        c["layout"] = "NDH"
        return "kv_layout"
    return None


KINDS = ["position past the length", "request out of range", "negative request other than -1",
         "page id past the cache", "negative page id", "indptr decreasing", "last page too long",
         "key dtype differs", "value shape differs", "int64 positions", "read-only cache",
         "k and v caches are one array", "two rows on one slot", "unknown layout"]


def _fresh(c):
    """A copy of case ``c`` whose cache ``corrupt`` may mark read-only."""
    cache = c["cache"]
    return dict(c, cache=cache.copy() if isinstance(cache, np.ndarray)
                else tuple(a.copy() for a in cache))


@pytest.mark.parametrize("budget", BUDGETS)
def test_invalid_append_is_refused_by_name_and_writes_nothing(budget):
    def prop(c):
        args = append_args(c)
        assert_refused(c, lambda: append_paged_kv_cache(*args), *args)
    run(prop, corrupted(append_cases(), corrupt, KINDS, _fresh), 80, budget)
