"""Rounds of a loop iteration's whole units (chunked prefill): the mask-free chunks that end at
each unit's tail, ``work.ROUND_CHUNKS`` a round, folded for all the iteration's units at once
(``kernel_items.group_rounds``), as many rounds as the least of the units' ROUNDS
(``work.with_unit_tail``); each unit's own loops end where its rounds begin. Checked: the rows'
ROUNDS and ranges, and the kernel against the reference with rounds, without (a unit of the
iteration has none), with windows, and on two cores."""

import numpy as np
import pytest

from nki_kernels import simulate
from nki_kernels.paged_attention import work
from nki_kernels.paged_attention.work import (C0, C1, FULL_HI, FULL_LO, LEN, META_COLS,
                                              ROUND_CHUNKS, ROUND_SLOT, ROUNDS, ROUNDS1,
                                              ROUNDS_MAX, SLOT0,
                                              unit_rounds, with_unit_tail)

from .test_prefill import check, make_prefill_case


def _row(c0, lo, hi, c1, length):
    row = np.zeros(META_COLS, np.int64)
    row[C0], row[FULL_LO], row[FULL_HI], row[C1], row[LEN] = c0, lo, hi, c1, length
    return row


@pytest.mark.parametrize("c0, lo, hi, c1", [(0, 0, 0, 1), (0, 0, 6, 8), (0, 0, 8, 9),
                                            (0, 0, 14, 16), (3, 5, 20, 22), (0, 0, 30, 31),
                                            (2, 2, 2, 3), (0, 0, 11, 13), (0, 0, 3, 9)])
def test_rounds_take_whole_blocks_of_the_mask_free_chunks_before_the_tail(c0, lo, hi, c1):
    row = with_unit_tail(_row(c0, lo, hi, c1, c1 * 128), 4, 16)
    fours, ones = int(row[ROUNDS]), int(row[ROUNDS1])
    assert 0 <= fours <= ROUNDS_MAX and 0 <= ones < ROUND_CHUNKS
    if fours or ones:   # mask-free from the rounds' first chunk up to the tail
        assert row[FULL_HI] == row[C1]
        assert row[C1] - fours * ROUND_CHUNKS - ones >= row[FULL_LO] >= row[C0]
        assert row[ROUND_SLOT] == row[SLOT0] + (row[C1] - ROUND_CHUNKS - row[C0]) * 8
    assert (fours, ones) == unit_rounds(int(row[C0]), int(row[FULL_LO]), int(row[FULL_HI]),
                                        int(row[C1]))


@pytest.mark.parametrize("before, rounds", [
    (0, (0, 0)), (1, (0, 1)), (2, (0, 2)), (3, (0, 3)), (4, (1, 0)), (6, (1, 2)), (8, (2, 0)),
    (12, (3, 0)), (16, (0, 0)), (17, (0, 1)), (20, (1, 0)), (32, (0, 0)), (36, (1, 0))])
def test_a_unit_asks_for_the_rounds_that_save_its_loops(before, rounds):
    """Mask-free chunks before the tail: rounds of four, then of one, when they leave fewer of
    its own loop iterations (a block of 16 or 32 is one: no rounds), half an iteration a
    round."""
    assert unit_rounds(0, 0, before, before) == rounds
    fours, ones = unit_rounds(0, 1, before, before)          # a masked first chunk
    assert fours * ROUND_CHUNKS + ones <= max(0, before - 1)
    assert unit_rounds(0, 0, max(0, before - 1), before) == (0, 0)    # masked up to the tail


def _rounds_run():
    """Moves of the units' round slots in the last launch: one per unit and round (inside the
    rounds' loop, itself inside the loop over unit groups)."""
    return sum(1 for e in simulate.last_trace() if e.op == "tensor_scalar"
               and any(o.tensor == "item" and o.role == "dst" for o in e.operands)
               and e.loop_depth >= 2 and e.details.get("op") == ("add",))


# chunks of 40 / 33 queries (whole units; page 16) over prefixes of 5-12 chunks: rounds, a unit
# without a prefix in the iteration (none), windows
@pytest.mark.parametrize("q_lens, kv_lens, window, rounds", [
    ([40, 40], [1000, 1200], -1, True),
    ([40, 33], [1550, 1800], -1, True),                 # two and three rounds
    ([40, 33, 40, 40], [900, 1000, 1100, 1500], -1, True),
    ([40, 33, 40, 40], [700, 900, 1100, 1500], -1, False),
    ([40, 40, 40], [1152, 40, 700], -1, False),
    ([40, 40], [1500, 1400], 900, True),
    ([64, 40, 33], [2100, 1300, 650], 300, False),
], ids=str)
def test_rounds_match_the_reference(rng, q_lens, kv_lens, window, rounds):
    args = make_prefill_case(rng, q_lens, kv_lens, 16, 2, 4, 32)
    with simulate.use_target("trn2"):
        check(args, causal=True, window_left=window)
        assert (_rounds_run() > 0) == rounds


def test_rounds_off_give_the_same_result(rng, monkeypatch):
    """The same launch with no rounds (every unit's chunks in its own loops) agrees with it."""
    args = make_prefill_case(rng, [40, 33, 40], [900, 1000, 1300], 16, 2, 4, 32)
    with simulate.use_target("trn2"):
        with_rounds, _ = check(args, causal=True)
        assert _rounds_run() > 0
        monkeypatch.setattr(work, "ROUNDS_MAX", 0)
        without, _ = check(args, causal=True)
        assert _rounds_run() == 0
    np.testing.assert_allclose(with_rounds, without, rtol=1e-5, atol=1e-5)


def test_rounds_on_two_cores(rng):
    args = make_prefill_case(rng, [40, 40, 33, 40], [800, 1000, 1200, 900], 16, 2, 4, 32)
    with simulate.use_target("trn2"):
        check(args, causal=True, lnc=2)


def test_rounds_in_bf16_on_the_serving_layer(rng):
    """Llama-3-8B's layer (8 kv heads of 128, GQA 4, bf16): grouped gathers of 4 tokens."""
    import ml_dtypes
    bf16 = ml_dtypes.bfloat16
    args = make_prefill_case(rng, [64, 64, 40], [900, 1100, 1000], 16, 8, 4, 128, q_dtype=bf16,
                             kv_dtype=bf16)
    with simulate.use_target("trn2"):
        check(args, dtype="bfloat16", causal=True)
        assert _rounds_run() > 0


@pytest.mark.parametrize("target, layout", [("trn1", "NHD"), ("trn2", "HND")])
def test_rows_with_rounds_elsewhere(rng, target, layout):
    """NeuronCore-v2 (no indirect gathers) runs every chunk in the units' own loops whatever
    the rows ask; the HND layout's gathers take the rounds too."""
    args = make_prefill_case(rng, [40, 40, 33], [900, 1000, 1300], 16, 2, 4, 32, layout=layout)
    with simulate.use_target(target):
        check(args, causal=True)
        assert (_rounds_run() > 0) == (target == "trn2")
