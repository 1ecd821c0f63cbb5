"""Blocks of queries (speculative verification) end each unit in one tail item (work.TAIL): its
masked chunks and the mask-free chunks past the unit's whole blocks of TAIL_CHUNKS, gathered as
one block whose slots past the unit's keys read nothing."""

import numpy as np
import pytest

from nki_kernels import simulate

from .test_prefill import check, make_prefill_case


def _tail_blocks():
    """Instructions of the last launch that select a tail's keys: by its mask predicate
    (``block_keep``: the one-block masked gathers, which a verification launch runs for its
    tails only), or on NeuronCore-v3 by its bounds (a ``range_select`` on the block's
    ``key_limit`` rows, ``kernel_softmax.KeyRange``)."""
    def selects(ev):
        names = [o.tensor for o in ev.operands]
        return (names[:1] == ["block_keep"]
                or (ev.op == "range_select" and "key_limit" in names))
    return sum(1 for ev in simulate.last_trace().events if ev.operands and selects(ev))


# q_lens, kv_lens, page size: tails of 1 to 4 chunks (the last partial or whole, past blocks of
# 4 mask-free chunks or none), drafts straddling a chunk boundary, a window
CASES = [
    ([4, 4, 4], [1021, 1100, 130], 16),
    ([8, 2, 5], [600, 257, 384], 8),
    ([3, 7], [129, 513], 32),
    ([6], [2000], 16),
]


@pytest.mark.parametrize("lnc", [1, 2])
@pytest.mark.parametrize("q_lens, kv_lens, page_size", CASES, ids=str)
def test_tails_match_the_reference(rng, q_lens, kv_lens, page_size, lnc):
    args = make_prefill_case(rng, q_lens, kv_lens, page_size, 2, 4, 32)
    with simulate.use_target("trn2"):
        check(args, lnc=lnc, causal=True)
        assert _tail_blocks() > 0
        check(args, lnc=lnc, causal=True, window_left=300)


def test_a_split_units_first_part_ends_its_tail_at_the_cut(rng):
    """One request on two cores: the first core's part ends inside the request's keys, so its
    tail's slots past the cut (keys the second core takes) read nothing: each key counted once
    (``LEN`` clipped to the tail's chunks)."""
    for kv in (700, 1000, 1500):
        args = make_prefill_case(rng, [4], [kv], 16, 2, 4, 32)
        with simulate.use_target("trn2"):
            check(args, lnc=2, causal=True)



@pytest.mark.parametrize("lnc", [1, 2])
@pytest.mark.parametrize("hole", [None, 300], ids=["tree", "hole"])
def test_custom_masks_take_each_slots_bits(rng, lnc, hole):
    """Custom masks: a draft tree over each request's prefix (its drafts see the prefix, their
    ancestors and themselves), and the same with a key of the prefix hidden from one query (the
    chunks from there on are masked: single chunks, then the tail): every tail slot ands its own
    chunk's bits."""
    q_lens, kv_lens = [8, 5, 3], [1000, 700, 131]
    args = make_prefill_case(rng, q_lens, kv_lens, 16, 2, 4, 32)
    masks = []
    for q, kv in zip(q_lens, kv_lens):
        m = np.ones((q, kv), bool)
        m[:, kv - q:] = np.tril(rng.random((q, q)) < 0.6) | np.eye(q, dtype=bool)
        if hole is not None and kv > hole:
            m[q // 2, hole] = False
        masks.append(m.reshape(-1))
    with simulate.use_target("trn2"):
        check(args, lnc=lnc, custom_mask=np.concatenate(masks))
        assert _tail_blocks() > 0


def test_wide_verification_items_fit_sbuf(rng):
    """16 drafts at GQA 16 with an fp32 cache and head_dim 256: 8 KiB of query stationaries per
    item, so a loop iteration takes fewer items (work.ITERATION_QUERY_BYTES; sixteen overflowed
    SBUF) and the one-chunk masked items' gathers beyond UPFRONT_BYTES wait for the pipeline."""
    args = make_prefill_case(rng, [16] * 9, [40, 300, 129, 16, 200, 77, 500, 18, 260], 16, 4, 16,
                             256)
    with simulate.use_target("trn2"):
        check(args, causal=True)


@pytest.mark.parametrize("lnc, window_left", [(1, -1), (2, 300)])
def test_wide_decode_items_gather_through_the_pipeline(rng, monkeypatch, lnc, window_left):
    """16 kv heads of 128 in fp32: 16 KiB of K and V per one-chunk masked item, so a loop
    iteration issues four items' gathers up front (kernel_items.UPFRONT_BYTES) and the rest
    through the pipeline, each from its rows and mask made with the iteration's."""
    from nki_kernels.paged_attention import batch_decode, batch_decode_ref, kernel_items
    from .conftest import assert_close, make_decode_case
    from nki_kernels.paged_attention import work
    deferred = []
    load_rows = kernel_items._load_rows

    def spy(st, row, zero_v=True, later=None):
        deferred.append(st.scratch is not None)
        return load_rows(st, row, zero_v, later)
    monkeypatch.setattr(kernel_items, "_load_rows", spy)
    monkeypatch.setattr(work, "_late_tail", lambda *bounds: False)    # single masked chunks
    lens = [int(n) for n in rng.integers(300, 1200, 10)]
    args = make_decode_case(rng, lens, 16, 16, 2, 128, q_dtype=np.float32, kv_dtype=np.float32)
    with simulate.use_target("trn2"):
        out, lse = batch_decode(*args, return_lse=True, lnc=lnc, window_left=window_left)
    ref, ref_lse = batch_decode_ref(*args, return_lse=True, window_left=window_left)
    assert_close(out, ref, lse, ref_lse, dtype="float32")
    assert sum(deferred) > 0
