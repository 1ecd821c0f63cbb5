"""Properties of FlashInfer's ragged-KV and cascade layouts: random ragged batches (causal, or
with a custom mask, flat or bit-packed) against the reference written from the definition, random two-level prefix trees against flat attention over
each request's concatenated pages; inputs unchanged."""

import numpy as np
import pytest
from hypothesis import strategies as st

from nki_kernels.paged_attention import (batch_prefill_ragged, batch_prefill_ragged_ref,
                                         batch_prefill_ref, cascade_attention, segment_packbits)

from .cases import BUDGETS, TARGETS, on_target, run, snapshot, unchanged

TOL = 2e-5


@st.composite
def ragged_cases(draw):
    """Ragged queries over packed K/V; lengths sometimes multiples of 4 or 16, so the packed
    rows run as pages of more than one row."""
    B = draw(st.integers(1, 4))
    align = draw(st.sampled_from([1, 4, 16]))
    kv_lens = [-(-n // align) * align for n in draw(st.lists(st.integers(0, 70), min_size=B,
                                                             max_size=B))]
    causal = draw(st.booleans())
    q_lens = [draw(st.integers(0, min(n, 9) if causal else 9)) for n in kv_lens]
    H, G, D = draw(st.sampled_from([(1, 1, 8), (2, 2, 16), (1, 4, 5)]))
    rng = np.random.default_rng(draw(st.integers(0, 2**31 - 1)))
    kv = np.concatenate([[0], np.cumsum(kv_lens)]).astype(np.int32)
    qo = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    rows = int(kv[-1]) + draw(st.sampled_from([0, 0, 3]))     # rows past kv_indptr[-1]: unread
    mask = None
    if draw(st.booleans()):        # a custom mask instead (it overrides causal), some rows empty
        keep = draw(st.sampled_from([0.0, 0.3, 0.9, 1.0]))
        mask = rng.random(int(np.dot(q_lens, kv_lens))) < keep
    return dict(target=draw(st.sampled_from(TARGETS)), causal=causal, qo=qo, kv=kv, mask=mask,
                packed=draw(st.booleans()),
                q=rng.standard_normal((int(qo[-1]), H * G, D)).astype(np.float32),
                k=rng.standard_normal((rows, H, D)).astype(np.float32),
                v=rng.standard_normal((rows, H, D)).astype(np.float32),
                window=draw(st.sampled_from([-1, 0, 5, 2**31 - 1])))


@pytest.mark.parametrize("budget", BUDGETS)
def test_ragged_equals_its_reference(budget):
    def prop(c):
        before = snapshot(c["q"], c["k"], c["v"])
        options = dict(causal=c["causal"], window_left=c["window"])
        if c["mask"] is not None and c["packed"]:
            sizes = np.diff(c["qo"]).astype(np.int64) * np.diff(c["kv"])
            options["packed_custom_mask"], options["mask_indptr"] = segment_packbits(
                c["mask"], np.concatenate([[0], np.cumsum(sizes)]), bitorder="little")
        elif c["mask"] is not None:
            options["custom_mask"] = c["mask"]
        with on_target(c):
            out = batch_prefill_ragged(c["q"], c["k"], c["v"], c["qo"], c["kv"], **options)
        want = batch_prefill_ragged_ref(c["q"], c["k"], c["v"], c["qo"], c["kv"], **options)
        np.testing.assert_allclose(out, want, atol=TOL, rtol=TOL)
        assert unchanged(before)
    run(prop, ragged_cases(), 20, budget)


@st.composite
def prefix_trees(draw):
    """A shared prefix (whole pages) and per-request private tails, as two cascade levels."""
    P = draw(st.sampled_from([1, 4, 16]))
    shared_pages = draw(st.integers(0, 4))
    B = draw(st.integers(1, 4))
    tails = draw(st.lists(st.integers(1, 30), min_size=B, max_size=B))
    q_lens = [draw(st.integers(1, min(n, 4))) for n in tails]
    tail_pages = [-(-n // P) for n in tails]
    N = shared_pages + sum(tail_pages) + 1
    rng = np.random.default_rng(draw(st.integers(0, 2**31 - 1)))
    order = rng.permutation(N).astype(np.int32)
    top, rest = order[:shared_pages], order[shared_pages:]
    own = np.split(rest[:sum(tail_pages)], np.cumsum(tail_pages)[:-1])
    H, G, D = 2, 2, 8
    Q = sum(q_lens)
    qo = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    last = np.array([(n - 1) % P + 1 for n in tails], np.int32)
    levels = ([np.array([0, Q], np.int32), qo],
              [np.array([0, shared_pages], np.int32),
               np.concatenate([[0], np.cumsum(tail_pages)]).astype(np.int32)],
              [top.astype(np.int32), np.concatenate(own).astype(np.int32)],
              [np.array([P if shared_pages else 0], np.int32), last])
    flat = (np.concatenate([[0], np.cumsum([shared_pages + t for t in tail_pages])])
            .astype(np.int32), np.concatenate([np.concatenate([top, o]) for o in own])
            .astype(np.int32))
    return dict(target=draw(st.sampled_from(TARGETS)), causal=draw(st.booleans()),
                q=rng.standard_normal((Q, H * G, D)).astype(np.float32),
                cache=rng.standard_normal((N, 2, P, H, D)).astype(np.float32),
                levels=levels, flat=flat, qo=qo, last=last)


@pytest.mark.parametrize("budget", BUDGETS)
def test_cascade_equals_flat_attention(budget):
    def prop(c):
        before = snapshot(c["q"], c["cache"])
        with on_target(c):
            out = cascade_attention(c["q"], c["cache"], *c["levels"], causal=c["causal"])
        want = batch_prefill_ref(c["q"], c["cache"], c["qo"], *c["flat"], c["last"],
                                 causal=c["causal"])
        np.testing.assert_allclose(out, want, atol=TOL, rtol=TOL)
        assert unchanged(before)
    run(prop, prefix_trees(), 15, budget)
