"""Property-based fuzzing of attention over the paged cache (``batch_decode``, ``batch_prefill``
with and without the fused write, ``merge_states``) on trn1 and trn2: outputs within the
per-dtype tolerance of the float64 references, the cache untouched by attention (written only
where the fused write puts new tokens), and invalid calls refused by name with nothing changed."""

import ml_dtypes
import numpy as np
import pytest
from hypothesis import strategies as st

from nki_kernels.paged_attention import (batch_decode, batch_decode_ref, batch_prefill,
                                                batch_prefill_ref, merge_states)
from nki_kernels.paged_kv_append import append_paged_kv_cache_ref, get_batch_indices_positions

from .cases import (BUDGETS, TARGETS, assert_refused, bits, cache_for, corrupted, lnc_for,
                    on_target, page_tables, run, snapshot, unchanged)

# atol = rtol per q/cache dtype against the float64 reference (as the kernel tests')
TOL = {"float32": 2e-5, "float16": 2e-3, "bfloat16": 2e-2, "float8_e4m3fn": 3e-2,
       "float8_e5m2": 3e-2}
DTYPES = (np.float32, np.float16, ml_dtypes.bfloat16, ml_dtypes.float8_e4m3fn,
          ml_dtypes.float8_e5m2)


@st.composite
def attention_cases(draw, max_q=1):
    """A paged cache, queries and options; ``max_q`` > 1: ragged query counts per request."""
    table = draw(page_tables(max_batch=4, max_len=45))
    H, group = draw(st.integers(1, 2)), draw(st.integers(1, 4))
    D = draw(st.sampled_from([1, 3, 8, 16]))
    dtype = draw(st.sampled_from(DTYPES))
    layout, fused = draw(st.sampled_from(["NHD", "HND"])), draw(st.booleans())
    lens = table["lens"]
    q_lens = np.array([draw(st.integers(0, min(int(n), max_q))) for n in lens], np.int32) \
        if max_q > 1 else np.ones(lens.size, np.int32)
    rng = np.random.default_rng(table["seed"] + 3)
    fp8 = np.dtype(dtype).itemsize == 1           # an fp8 cache: bf16 queries, K/V scales
    q_dtype = ml_dtypes.bfloat16 if fp8 else dtype
    q = rng.standard_normal((int(q_lens.sum()), H * group, D)).astype(np.float32).astype(q_dtype)
    scales = {}
    if fp8:
        per_head = (rng.random(H) + 0.5).astype(np.float32)
        scales = dict(k_scale=draw(st.sampled_from([1.0, 0.25, "per head"])),
                      v_scale=draw(st.sampled_from([1.0, 2.0, "per head"])))
        scales = {k: per_head if v == "per head" else v for k, v in scales.items()}
    options = dict(
        window_left=draw(st.sampled_from([-1, -1, 0, 1, 5, 17])),
        logits_soft_cap=draw(st.sampled_from([0.0, 0.0, 4.0])),
        sm_scale=draw(st.sampled_from([None, 0.3])),
        sinks=(rng.standard_normal(H * group).astype(np.float32)
               if draw(st.booleans()) else None), **scales)
    target = draw(st.sampled_from(TARGETS))
    return dict(table, H=H, HQ=H * group, D=D, dtype=dtype, layout=layout, fused=fused,
                q=q, q_lens=q_lens, options=options, target=target, lnc=draw(lnc_for(target)),
                cache=cache_for(table, H, D, dtype, layout, fused, table["seed"] + 2))


def _table(c):
    return c["kv_indptr"], c["kv_indices"], c["kv_last_page_len"]


def _close(got, want, dtype, what):
    tol = TOL[np.dtype(dtype).name]
    np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), atol=tol,
                               rtol=tol, err_msg=what)


def _check_lse(got, want, dtype):
    tol = TOL[np.dtype(dtype).name]
    both_inf = np.isneginf(got) & np.isneginf(want)
    np.testing.assert_allclose(np.where(both_inf, 0, got), np.where(both_inf, 0, want),
                               atol=max(tol, 1e-5) * 10, rtol=tol, err_msg="lse")


@pytest.mark.parametrize("budget", BUDGETS)
def test_decode_matches_the_reference_and_reads_only(budget):
    def prop(c):
        snap = snapshot(c["cache"], *_table(c), c["q"])
        with on_target(c):
            out, lse = batch_decode(c["q"], c["cache"], *_table(c), c["layout"],
                                    return_lse=True, lnc=c["lnc"], **c["options"])
        want, want_lse = batch_decode_ref(c["q"], c["cache"], *_table(c), c["layout"],
                                          return_lse=True, **c["options"])
        assert out.dtype == c["q"].dtype and out.shape == c["q"].shape
        _close(out, want, c["dtype"], "out")
        _check_lse(lse, want_lse, c["dtype"])
        assert unchanged(snap), "decode changed an input"
    run(prop, attention_cases(), 40, budget)


def _query_indptr(c):
    return np.concatenate([[0], np.cumsum(c["q_lens"])]).astype(np.int32)


@pytest.mark.parametrize("budget", BUDGETS)
def test_prefill_matches_the_reference_causal_or_not(budget):
    def prop(c):
        causal = bool(c["seed"] % 2)
        qo = _query_indptr(c)
        snap = snapshot(c["cache"], *_table(c), c["q"], qo)
        with on_target(c):
            out, lse = batch_prefill(c["q"], c["cache"], qo, *_table(c), c["layout"],
                                     causal=causal, return_lse=True, lnc=c["lnc"],
                                     **c["options"])
        want, want_lse = batch_prefill_ref(c["q"], c["cache"], qo, *_table(c), c["layout"],
                                           causal=causal, return_lse=True, **c["options"])
        _close(out, want, c["dtype"], "out")
        _check_lse(lse, want_lse, c["dtype"])
        assert unchanged(snap), "prefill changed an input"
    run(prop, attention_cases(max_q=9), 25, budget)


@pytest.mark.parametrize("budget", BUDGETS)
def test_fused_write_then_attention_equals_append_then_reference(budget):
    """The new tokens' K/V written by the prefill launch itself: the cache equals the reference
    append bit for bit (nothing else written), the output the reference attention over it."""
    def prop(c):
        qo = _query_indptr(c)
        rng = np.random.default_rng(c["seed"] + 4)
        k, v = (rng.standard_normal((qo[-1], c["H"], c["D"])).astype(np.float32)
                .astype(c["dtype"]) for _ in range(2))
        batch, pos = get_batch_indices_positions(qo, c["lens"].astype(np.int32), int(qo[-1]))
        appended = append_paged_kv_cache_ref(k, v, batch, pos, c["cache"], c["kv_indices"],
                                             c["kv_indptr"], c["kv_last_page_len"], c["layout"])
        with on_target(c):
            out = batch_prefill(c["q"], c["cache"], qo, *_table(c), c["layout"], causal=True,
                                append_key=k, append_value=v, lnc=c["lnc"], **c["options"])
        for got, want in zip(*(x if isinstance(x, tuple) else (x,)
                               for x in (c["cache"], appended))):
            assert np.array_equal(bits(got), bits(want)), "cache differs from the reference append"
        want = batch_prefill_ref(c["q"], appended, qo, *_table(c), c["layout"], causal=True,
                                 **c["options"])
        _close(out, want, c["dtype"], "out")
    run(prop, attention_cases(max_q=6), 20, budget)


# ---- invalid calls ---------------------------------------------------------------------------

def corrupt(c, kind):
    """Corrupt decode case ``c``; return the text the refusal names, or None if it cannot."""
    N, P = c["num_pages"], c["page_size"]
    if kind == "page id past the cache" and c["kv_indptr"][-1] > 0:
        c["kv_indices"] = c["kv_indices"].copy()
        c["kv_indices"][0] = N
        return "kv_indices"
    if kind == "indptr longer than indices":
        c["kv_indptr"] = c["kv_indptr"].copy()
        c["kv_indptr"][-1] = c["kv_indices"].size + 1
        return "kv_indptr"
    if kind == "last page empty for a request with pages" and (c["lens"] > 0).any():
        c["kv_last_page_len"] = c["kv_last_page_len"].copy()
        c["kv_last_page_len"][int(np.flatnonzero(c["lens"] > 0)[0])] = 0
        return "kv_last_page_len"
    if kind == "last page too long" and (c["lens"] > 0).any():
        c["kv_last_page_len"] = c["kv_last_page_len"].copy()
        c["kv_last_page_len"][int(np.flatnonzero(c["lens"] > 0)[0])] = P + 1
        return "kv_last_page_len"
    if kind == "query heads not a multiple of kv heads" and c["H"] > 1:
        c["q"] = np.concatenate([c["q"], c["q"][:, :1]], axis=1)        # HQ + 1 heads
        return "num_qo_heads"
    if kind == "query head_dim differs":
        c["q"] = np.zeros(c["q"].shape[:2] + (c["D"] + 1,), c["q"].dtype)
        return "q head_dim"
    if kind == "batch differs from the table":
        c["q"] = np.concatenate([c["q"], c["q"][:1]])
        return "kv_indptr has"
    if kind == "int64 indices":
        c["kv_indices"] = c["kv_indices"].astype(np.int64)
        return "kv_indices"
    if kind == "float64 query":
        c["q"] = c["q"].astype(np.float64)
        return "q dtype"
    if kind == "sm_scale as text":
        c["options"] = dict(c["options"], sm_scale="0.1")
        return "sm_scale"
    if kind == "sinks of the wrong length":
        c["options"] = dict(c["options"], sinks=np.zeros(c["HQ"] + 1, np.float32))
        return "sinks"
    if kind == "window below -1":
        c["options"] = dict(c["options"], window_left=-2)
        return "window_left"
    return None


KINDS = ["page id past the cache", "indptr longer than indices",
         "last page empty for a request with pages", "last page too long",
         "query heads not a multiple of kv heads", "query head_dim differs",
         "batch differs from the table", "int64 indices", "float64 query", "sm_scale as text",
         "sinks of the wrong length", "window below -1"]


@pytest.mark.parametrize("budget", BUDGETS)
def test_invalid_decode_is_refused_by_name_and_changes_nothing(budget):
    def prop(c):
        assert_refused(c, lambda: batch_decode(c["q"], c["cache"], *_table(c), c["layout"],
                                               **c["options"]),
                       c["cache"], *_table(c), c["q"])
    run(prop, corrupted(attention_cases(), corrupt, KINDS), 60, budget)


# ---- merge_states ----------------------------------------------------------------------------

@st.composite
def states(draw):
    n, parts, H, D = (draw(st.integers(1, 3)), draw(st.integers(1, 4)), draw(st.integers(1, 3)),
                      draw(st.sampled_from([1, 5])))
    rng = np.random.default_rng(draw(st.integers(0, 2**31 - 1)))
    v = rng.standard_normal((n, H, parts, D)).astype(np.float32)      # [..., parts, D]
    s = (rng.standard_normal((n, H, parts)) * 4).astype(np.float32)     # [..., parts]
    holes = rng.random(s.shape) < draw(st.sampled_from([0.0, 0.3]))     # empty parts: -inf
    s[holes] = -np.inf
    nans = rng.random(s.shape) < draw(st.sampled_from([0.0, 0.0, 0.2]))
    s[nans] = np.nan
    return v, s


def merge_ref(v, s):
    """Float64 merge of base-2 log-sum-exp states over the parts axis (v [n, H, parts, D],
    s [n, H, parts]), written out part by part; NaN in any part makes that row NaN."""
    v, s = v.astype(np.float64), s.astype(np.float64)
    n, H, parts, D = v.shape
    out, lse = np.zeros((n, H, D)), np.full((n, H), -np.inf)
    for i in range(n):
        for h in range(H):
            finite = [p for p in range(parts) if np.isfinite(s[i, h, p])]
            if not finite:
                continue
            top = max(s[i, h, p] for p in finite)
            total = sum(2.0 ** (s[i, h, p] - top) for p in finite)
            out[i, h] = sum(2.0 ** (s[i, h, p] - top) * v[i, h, p] for p in finite) / total
            lse[i, h] = top + np.log2(total)
    bad = np.isnan(s).any(axis=-1)
    out[bad], lse[bad] = np.nan, np.nan
    return out, lse


@pytest.mark.parametrize("budget", BUDGETS)
def test_merge_states_equals_the_float64_merge_and_propagates_nan(budget):
    def prop(case):
        v, s = case
        snap = snapshot(v, s)
        out, lse = merge_states(v, s)
        want, want_lse = merge_ref(v, s)
        np.testing.assert_allclose(out, want, atol=2e-6, rtol=2e-5)
        np.testing.assert_allclose(lse, want_lse, atol=2e-5, rtol=1e-6)
        assert unchanged(snap)
    run(prop, states(), 100, budget)
