"""Hypothesis strategies for the fuzz suite: small paged caches, page tables and rows, with sizes
that straddle page boundaries, and the runner that sets how many examples a property gets.

A case is a plain dict; ``snapshot``/``unchanged`` compare every array argument byte for byte.
"""

from __future__ import annotations

import os

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from nki_kernels import simulate
from nki_kernels.paged_kv_append import get_batch_indices_positions

TARGETS = ("trn1", "trn2")
CACHE_DTYPES = (np.float32, np.float16, ml_dtypes.bfloat16, ml_dtypes.float8_e4m3fn)

# (examples multiplier, marks): the default run, and ten times as many behind ``slow``
BUDGETS = [pytest.param(1, id="default"),
           pytest.param(10, id="long", marks=pytest.mark.slow)]


def run(prop, strategy, examples: int, budget: int) -> None:
    """Check ``prop(case)`` on ``examples * budget`` cases drawn from ``strategy``. The default
    run is derandomised (the same cases every run); the long run draws new ones each time, or
    the ones of the seed ``NKI_FUZZ_SEED`` when it is set (CI: a fixed seed, replayable)."""
    test = settings(max_examples=examples * budget, deadline=None, derandomize=budget == 1,
                    database=None, print_blob=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.filter_too_much])(given(strategy)(prop))
    fixed = os.environ.get("NKI_FUZZ_SEED")
    if budget > 1 and fixed:
        test = seed(int(fixed))(test)
    test()


def bits(a) -> np.ndarray:
    return np.ascontiguousarray(a).reshape(-1).view(np.uint8).copy()


def snapshot(*arrays):
    """Bytes of every array among ``arrays`` (tuples of arrays flattened)."""
    flat = []
    for a in arrays:
        flat.extend(a if isinstance(a, tuple) else (a,))
    return [(a, bits(a)) for a in flat if isinstance(a, np.ndarray)]


def unchanged(snap) -> bool:
    return all(np.array_equal(bits(a), b) for a, b in snap)


@st.composite
def page_tables(draw, max_batch=5, max_len=40, min_len=0):
    """A shuffled CSR page table: ``lens`` tokens per request, pages of ``page_size``, a few
    pages nobody owns. Returns dict(page_size, lens, num_pages, kv_indptr, kv_indices,
    kv_last_page_len)."""
    P = draw(st.sampled_from([1, 3, 8, 16]))
    B = draw(st.integers(1, max_batch))
    lens = np.array(draw(st.lists(st.integers(min_len, max_len), min_size=B, max_size=B)),
                    np.int64)
    pages = -(-lens // P)
    spare = draw(st.integers(0, 3))
    num_pages = int(pages.sum()) + spare + 1
    seed = draw(st.integers(0, 2**31 - 1))
    perm = np.random.default_rng(seed).permutation(num_pages).astype(np.int32)
    indptr = np.concatenate([[0], np.cumsum(pages)]).astype(np.int32)
    extra = draw(st.integers(0, 2))          # kv_indices may be longer than kv_indptr[-1]
    indices = np.concatenate([perm[:indptr[-1]], perm[::-1][:extra]]).astype(np.int32)
    last = np.where(lens > 0, (lens - 1) % P + 1, 0).astype(np.int32)
    return dict(page_size=P, lens=lens, num_pages=num_pages, kv_indptr=indptr,
                kv_indices=indices, kv_last_page_len=last, seed=seed)


def cache_for(table, H, D, dtype, layout, fused, seed):
    """A random-filled cache for ``table`` (a fused array, or a (k, v) pair)."""
    N, P = table["num_pages"], table["page_size"]
    inner = (P, H, D) if layout == "NHD" else (H, P, D)
    rng = np.random.default_rng(seed)
    data = rng.standard_normal((N, 2) + inner).astype(np.float32).astype(dtype)
    return data if fused else (data[:, 0].copy(), data[:, 1].copy())


@st.composite
def append_cases(draw):
    """A valid ``append_paged_kv_cache`` call: each request appends its last few tokens, rows
    in a random order, with a few padding rows (batch -1)."""
    table = draw(page_tables())
    H, D = draw(st.integers(1, 3)), draw(st.sampled_from([1, 4, 6, 16]))
    dtype = draw(st.sampled_from(CACHE_DTYPES))
    layout = draw(st.sampled_from(["NHD", "HND"]))
    fused = draw(st.booleans())
    lens = table["lens"]
    append = np.array([draw(st.integers(0, int(n))) for n in lens], np.int64)
    pad = draw(st.integers(0, 3))
    indptr = np.concatenate([[0], np.cumsum(append)]).astype(np.int32)
    nnz = int(indptr[-1]) + pad
    batch, positions = get_batch_indices_positions(indptr, lens.astype(np.int32), nnz)
    order = np.random.default_rng(table["seed"]).permutation(nnz)
    rng = np.random.default_rng(table["seed"] + 1)
    k = rng.standard_normal((nnz, H, D)).astype(np.float32).astype(dtype)
    v = rng.standard_normal((nnz, H, D)).astype(np.float32).astype(dtype)
    cache = cache_for(table, H, D, dtype, layout, fused, table["seed"] + 2)
    k_cache = cache if fused else cache[0]
    n = nnz * H * D
    if draw(st.booleans()) and 0 < n <= k_cache.size:
        k = k_cache.reshape(-1)[:n].reshape(nnz, H, D)              # rows that view the cache
    v_cache = cache if fused else cache[1]
    if draw(st.booleans()) and 0 < n <= v_cache.size:
        v = v_cache.reshape(-1)[v_cache.size - n:].reshape(nnz, H, D)   # the cache's tail
    target = draw(st.sampled_from(TARGETS))
    return dict(table, H=H, D=D, dtype=dtype, layout=layout, fused=fused, target=target,
                lnc=draw(lnc_for(target)), key=k, value=v, batch_indices=batch[order],
                positions=positions[order], cache=cache)


def lnc_for(target):
    """1, or on trn2 also 2 (the launch shared by the two cores of a logical core)."""
    return st.sampled_from([1, 2] if target == "trn2" else [1])


def append_args(c):
    return (c["key"], c["value"], c["batch_indices"], c["positions"], c["cache"],
            c["kv_indices"], c["kv_indptr"], c["kv_last_page_len"], c["layout"])


def written_mask(c):
    """[N, 2, P, H, D]-shaped (NHD) or [N, 2, H, P, D] (HND) bool: the slots the append writes,
    from the FlashInfer rule page = kv_indices[kv_indptr[b] + pos // P], entry = pos % P."""
    N, P, H, D = c["num_pages"], c["page_size"], c["H"], c["D"]
    shape = (N, 2, P, H, D) if c["layout"] == "NHD" else (N, 2, H, P, D)
    mask = np.zeros(shape, bool)
    for b, pos in zip(c["batch_indices"], c["positions"]):
        if b < 0:
            continue
        page = c["kv_indices"][c["kv_indptr"][b] + pos // P]
        if c["layout"] == "NHD":
            mask[page, :, pos % P] = True
        else:
            mask[page, :, :, pos % P] = True
    return mask


def fused_view(cache):
    """The cache as one [N, 2, ...] array (a pair stacked), for comparisons."""
    return cache if isinstance(cache, np.ndarray) else np.stack(cache, axis=1)


def on_target(c):
    return simulate.use_target(c["target"])


def corrupted(valid_cases, corrupt, kinds, fresh=dict):
    """A valid case from ``valid_cases`` spoiled by one of ``kinds`` that applies to it:
    ``corrupt(case, kind)`` changes the case and returns the text its refusal must contain, or
    None when the kind does not apply (tried on ``fresh(case)``, a copy it may change). The case
    gets ``kind`` and ``expect``."""
    @st.composite
    def draw_case(draw):
        c = draw(valid_cases)
        applicable = [k for k in kinds if corrupt(fresh(c), k) is not None]
        c["kind"] = draw(st.sampled_from(applicable))
        c["expect"] = corrupt(c, c["kind"])
        return c
    return draw_case()


def assert_refused(c, call, *inputs):
    """``call()`` raises ValueError/TypeError holding ``c["expect"]``, every array among
    ``inputs`` bit-identical afterwards."""
    snap = snapshot(*inputs)
    with on_target(c), pytest.raises((ValueError, TypeError)) as err:
        call()
    assert c["expect"] in str(err.value), (c["kind"], str(err.value))
    assert unchanged(snap), f"{c['kind']}: an input changed before the refusal"
