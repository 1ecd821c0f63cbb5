"""Property-based fuzzing of ``batch_prefill`` at serving sizes: up to 18 requests of up to 1600
keys and 200 queries, so a launch holds many blocks of queries over many chunks of keys (the
paths the small fuzz cases never reach: whole units in groups, their rounds and tails, the
groups a bucket guarantees, LNC=2 sharing). Outputs and LSE within the per-dtype tolerance of
the float64 reference, a fused write bit-exact against the reference append, inputs unchanged."""

import ml_dtypes
import numpy as np
import pytest
from hypothesis import strategies as st

from nki_kernels.paged_attention import batch_prefill, batch_prefill_ref
from nki_kernels.paged_kv_append import append_paged_kv_cache_ref, get_batch_indices_positions

from .cases import BUDGETS, TARGETS, bits, lnc_for, on_target, run, snapshot, unchanged
from .test_fuzz_attention import TOL, _check_lse, _close

DTYPES = (np.float32, ml_dtypes.bfloat16, np.float16)


@st.composite
def serving_cases(draw):
    """A shuffled page table of 1-18 requests, queries per request (causal: at most its keys),
    a random-filled cache, and options: window, soft cap, scale, sinks, custom mask, fused
    write, layout, target and LNC. Hypothesis draws the seed and the kind of launch; the sizes
    come from the seed, so every example differs (Hypothesis' own variations of one example
    would mostly repeat its shape)."""
    seed = draw(st.integers(0, 2**31 - 1))
    chunked = draw(st.booleans())            # like prompts fed one chunk each, or spread
    target = draw(st.sampled_from(TARGETS))
    rng = np.random.default_rng(seed)

    def pick(options):
        return options[int(rng.integers(len(options)))]
    P, H, G, D = pick([16, 32, 128, 256]), pick([1, 2, 8]), pick([1, 2, 4]), pick([64, 128])
    causal = bool(rng.random() < 0.7)
    if chunked:                  # a group's common prefix runs in rounds
        B = int(rng.integers(8, 19))
        lens = np.full(B, int(rng.integers(600, 1601)), np.int64)
        chunk = pick([64, 64, 16, 128])
        q_lens = np.full(B, min(chunk, int(lens[0])) if causal else chunk, np.int32)
    else:
        B = int(rng.integers(1, 19))
        lens = rng.integers(0, 1601, B).astype(np.int64)
        q_lens = np.array([rng.integers(0, (min(int(n), 200) if causal else 200) + 1)
                           for n in lens], np.int32)
    pages = -(-lens // P)
    num_pages = int(pages.sum()) + 3
    kv_indptr = np.concatenate([[0], np.cumsum(pages)]).astype(np.int32)
    dtype, layout = pick(DTYPES), pick(["NHD", "HND"])
    inner = (P, H, D) if layout == "NHD" else (H, P, D)
    options = dict(window_left=pick([-1, -1, -1, 100, 700]),
                   logits_soft_cap=pick([0.0, 0.0, 20.0]), sm_scale=pick([None, 0.05]),
                   sinks=(rng.standard_normal(H * G).astype(np.float32)
                          if rng.random() < 0.25 else None))
    if rng.random() < 0.25:      # a custom mask (replaces causal), some rows all masked
        parts = []
        for q_len, n in zip(q_lens, lens):
            keep = rng.random((int(q_len), int(n))) < pick([0.5, 0.97, 1.0])
            if q_len and n and rng.random() < 0.5:
                keep[rng.integers(0, q_len)] = False
            parts.append(keep.reshape(-1))
        options["custom_mask"] = np.concatenate(parts)
    return dict(seed=seed, page_size=P, lens=lens, H=H, HQ=H * G, D=D, dtype=dtype,
                layout=layout, causal=causal, options=options, target=target,
                lnc=draw(lnc_for(target)),
                fused=bool((q_lens <= lens).all()) and rng.random() < 0.4,
                kv_indptr=kv_indptr,
                kv_indices=rng.permutation(num_pages).astype(np.int32)[:kv_indptr[-1]].copy(),
                kv_last_page_len=np.where(lens > 0, (lens - 1) % P + 1, 0).astype(np.int32),
                qo_indptr=np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32),
                q=rng.standard_normal((int(q_lens.sum()), H * G, D)).astype(np.float32)
                .astype(dtype),
                cache=rng.standard_normal((num_pages, 2) + inner).astype(np.float32)
                .astype(dtype))


@pytest.mark.parametrize("budget", BUDGETS)
def test_serving_sized_prefill_matches_the_reference(budget):
    def prop(c):
        table = (c["kv_indptr"], c["kv_indices"], c["kv_last_page_len"])
        qo, cache, extra = c["qo_indptr"], c["cache"], {}
        want_cache = cache
        if c["fused"]:                       # the launch writes the new tokens' K/V first
            rng = np.random.default_rng(c["seed"] + 1)
            k, v = (rng.standard_normal((int(qo[-1]), c["H"], c["D"])).astype(np.float32)
                    .astype(c["dtype"]) for _ in range(2))
            batch, pos = get_batch_indices_positions(qo, c["lens"].astype(np.int32), int(qo[-1]))
            want_cache = append_paged_kv_cache_ref(k, v, batch, pos, cache, c["kv_indices"],
                                                   c["kv_indptr"], c["kv_last_page_len"],
                                                   c["layout"])
            extra = dict(append_key=k, append_value=v)
        snap = snapshot(c["q"], qo, *table)
        with on_target(c):
            out, lse = batch_prefill(c["q"], cache, qo, *table, c["layout"], causal=c["causal"],
                                     return_lse=True, lnc=c["lnc"], **c["options"], **extra)
        assert np.array_equal(bits(cache), bits(want_cache)), "the cache differs"
        want, want_lse = batch_prefill_ref(c["q"], want_cache, qo, *table, c["layout"],
                                           causal=c["causal"], return_lse=True, **c["options"])
        _close(out, want, c["dtype"], "out")
        _check_lse(lse, want_lse, c["dtype"])
        assert unchanged(snap), "prefill changed an input"
    run(prop, serving_cases(), 4, budget)


def test_the_cases_reach_serving_sizes():
    """The strategy draws launches of many requests over many chunks of keys (a guard against
    a strategy that silently shrinks to the small fuzz cases' sizes)."""
    seen = []

    def prop(c):
        seen.append((c["lens"].size, int(c["lens"].max(initial=0)),
                     int(np.diff(c["qo_indptr"]).max(initial=0))))
    run(prop, serving_cases(), 40, 1)
    assert max(b for b, _, _ in seen) >= 12 and max(n for _, n, _ in seen) >= 1000
    assert max(q for _, _, q in seen) >= 128
