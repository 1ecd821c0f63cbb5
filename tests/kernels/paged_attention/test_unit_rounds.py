"""Rounds of a loop iteration's whole units (chunked prefill): the mask-free chunks that end at
each unit's tail, ``work.ROUND_CHUNKS`` a round, folded for all the iteration's units at once
(``kernel_items.group_rounds``), as many rounds as the least of the units' ROUNDS
(``work.with_unit_tail``); each unit's own loops end where its rounds begin. Checked: the rows'
ROUNDS and ranges, and the kernel against the reference with rounds, without (a unit of the
iteration has none), with windows, and on two cores."""

import inspect

import numpy as np
import pytest

from nki_kernels import simulate
from nki_kernels.paged_attention import kernel_items, work
from nki_kernels.paged_attention.work import (C0, C1, FULL_HI, FULL_LO, LEN, META_COLS,
                                              ROUND_CHUNKS, ROUND_SLOT, ROUNDS, ROUNDS1, SLOT0,
                                              group_rounds_of, unit_groups, with_rounds)

from .test_prefill import check, make_prefill_case


def _row(c0, lo, hi, c1, length=0):
    row = np.zeros(META_COLS, np.int64)
    row[C0], row[FULL_LO], row[FULL_HI], row[C1], row[LEN] = c0, lo, hi, c1, length
    return row


def _rows(*befores):
    """Rows of units whose tails start ``before`` mask-free chunks in (chunk 0 on)."""
    return [_row(0, 0, b, b) for b in befores]


@pytest.mark.parametrize("befores, rounds", [
    ((4, 4, 4, 4), (1, 0)), ((1, 1, 1, 1), (0, 1)), ((8, 8, 8, 8), (2, 0)),
    ((0, 4, 4, 4), (0, 0)), ((16, 16), (0, 0)), ((5, 5, 5, 5), (1, 1)), ((3, 3), (0, 1)), ((6, 6, 6, 6), (1, 2)),
    ((12, 9, 8, 8), (2, 0)), ((3, 1, 1, 1), (0, 1)), ((32, 32, 32, 32), (0, 0))])
def test_a_group_takes_the_rounds_that_save_its_loops(befores, rounds):
    """The units' loop iterations plus one a round, fewest (a block of 16 or 32 is one
    iteration of a unit's own: no rounds), as many as the unit with fewest chunks allows."""
    assert group_rounds_of(_rows(*befores)) == rounds


def test_a_unit_whose_tail_follows_masked_chunks_takes_none():
    rows = _rows(8, 8, 8) + [_row(0, 0, 6, 8)]          # mask-free only up to chunk 6
    assert group_rounds_of(rows) == (0, 0)


def test_with_rounds_a_tail_takes_whole_chunks_rather_than_empty_slots():
    """A unit of 9 chunks (the last masked), tails of 4: without rounds its tail starts at the
    masked chunk (3 empty slots) so one loop iteration takes the 8 before; with rounds the tail
    holds 4 chunks and rounds fold the 5 before (no loop, no empty slot)."""
    assert work.unit_tail_cost(0, 0, 8, 9, 4)[1] == 8
    assert work.unit_tail_cost(0, 0, 8, 9, 4, rounds=True) == (0.5, 5)
    assert work.rounds_taken(4, 4, 16, 8, 1) and not work.rounds_taken(4, 4, 16, 1, 1)
    assert not work.rounds_taken(4, 4, 16, 2, 2) and not work.rounds_taken(4, 1, 16, 8, 1)


@pytest.mark.parametrize("per, units, groups", [
    (4, 11, [(0, 4), (4, 4), (8, 2)]), (4, 3, [(0, 2)]), (2, 5, [(0, 2), (2, 2)]),
    (1, 6, []), (4, 1, [])])
def test_groups_are_the_kernels_loop_iterations(per, units, groups):
    assert unit_groups(0, units, per) == groups


def test_rows_carry_their_groups_rounds_sorted_by_their_chunks():
    rows = _rows(1, 4, 0, 4, 4, 4, 9, 2)
    for row in rows:
        row[SLOT0] = 100
    spans = np.array([[0, len(rows), 0, 0]])
    out = with_rounds([r.copy() for r in rows], spans, 4, 16, 8, 1)
    assert [int(r[C1]) for r in out] == [9, 4, 4, 4, 4, 2, 1, 0]
    assert [(int(r[ROUNDS]), int(r[ROUNDS1])) for r in out] == [(1, 0)] * 4 + [(0, 0)] * 4
    for r in out[:4]:                    # its first round: the four chunks before its tail
        assert r[ROUND_SLOT] == 100 + (r[C1] - ROUND_CHUNKS) * 8
    single = with_rounds([r.copy() for r in rows[:1]], np.array([[0, 1, 0, 0]]), 4, 16, 1, 1)
    assert single[0][ROUNDS] == single[0][ROUNDS1] == 0


def _rounds_run():
    """Rounds the last launch ran: iterations of the loops ``group_rounds`` opens (inside the
    loop over unit groups, or in a lead group without it)."""
    lines, first = inspect.getsourcelines(kernel_items.group_rounds)
    inside = {f"kernel_items.py:{n}" for n in range(first, first + len(lines))}
    return sum(loop["iterations"] for loop in simulate.last_trace().loops
               if loop["location"] in inside)


@pytest.fixture(autouse=True)
def _tails_of_four(monkeypatch):
    """Tails of four slots, as these shapes were drawn for: the rounds fold the mask-free chunks
    before a unit's tail, and the chooser's eight slots would hold most of these prefixes
    whole (no rounds to check)."""
    monkeypatch.setenv("NKI_KERNELS_TAIL_SLOTS", "4")


# chunks of 40 / 33 queries (whole units; page 16) over prefixes of 5-12 chunks: rounds, a unit
# without a prefix in the iteration (none), windows
@pytest.mark.parametrize("q_lens, kv_lens, window, rounds", [
    ([40, 40], [1000, 1000], -1, True),
    ([40, 33, 40, 40], [1550] * 4, -1, True),              # rounds of four, then one
    ([40, 40, 40, 40], [600, 650, 700, 640], -1, True),     # rounds of one chunk
    ([40, 40, 40, 40], [700, 720, 760, 800], -1, True),     # two single chunks: a round of two
    ([40, 40, 40, 40], [820, 830, 850, 900], -1, True),     # three: a round of two, one of one
    ([40, 40, 40, 40], [1200, 1250, 1300, 1200], -1, True),  # four, then two single chunks
    ([40, 33, 40, 40], [900, 1000, 1100, 1500], -1, True),
    ([40, 40], [1152, 40], -1, False),                  # a unit with no prefix: none
    ([40, 40, 40, 40], [1152, 40, 700, 900], -1, True),    # its pair none, the lead pair's
    ([40, 40, 40], [1152, 40, 700], -1, True),        # (the third runs alone: a pair's rounds)
    ([40, 40, 40, 40], [1000, 1100, 1250, 1400], -1, True),   # unlike prefixes, empty slots
    ([40, 40], [1000, 1000], 700, True),
    ([40, 40, 40, 40], [1200, 1250, 1300, 1200], 1000, True),
    ([64, 40, 33], [2100, 1300, 650], 300, False),
    ([33, 33, 33, 33], [170, 180, 190, 200], -1, False),
], ids=str)
def test_rounds_match_the_reference(rng, q_lens, kv_lens, window, rounds):
    args = make_prefill_case(rng, q_lens, kv_lens, 16, 2, 4, 32)
    with simulate.use_target("trn2"):
        check(args, causal=True, window_left=window)
        assert (_rounds_run() > 0) == rounds


def test_rounds_off_give_the_same_result(rng, monkeypatch):
    """The same launch with no rounds (every unit's chunks in its own loops) agrees with it."""
    args = make_prefill_case(rng, [40, 33, 40, 40], [1550] * 4, 16, 2, 4, 32)
    with simulate.use_target("trn2"):
        with_rounds, _ = check(args, causal=True)
        assert _rounds_run() > 0
        monkeypatch.setattr(work, "ROUNDS_MAX", 0)
        monkeypatch.setattr(work, "ROUNDS1_MAX", 0)
        without, _ = check(args, causal=True)
        assert _rounds_run() == 0
    np.testing.assert_allclose(with_rounds, without, rtol=1e-5, atol=1e-5)


def test_rounds_on_two_cores(rng):
    args = make_prefill_case(rng, [40, 40, 33, 40, 40, 40, 40, 40], [1000] * 8, 16, 2, 4, 32)
    with simulate.use_target("trn2"):
        check(args, causal=True, lnc=2)
        assert _rounds_run() > 0


def test_rounds_in_bf16_on_the_serving_layer(rng):
    """Llama-3-8B's layer (8 kv heads of 128, GQA 4, bf16): grouped gathers of 4 tokens."""
    import ml_dtypes
    bf16 = ml_dtypes.bfloat16
    args = make_prefill_case(rng, [64, 64, 40, 40], [1000] * 4, 16, 8, 4, 128, q_dtype=bf16,
                             kv_dtype=bf16)
    with simulate.use_target("trn2"):
        check(args, dtype="bfloat16", causal=True)
        assert _rounds_run() > 0


@pytest.mark.parametrize("target, layout", [("trn1", "NHD"), ("trn2", "HND")])
def test_rows_with_rounds_elsewhere(rng, target, layout):
    """NeuronCore-v2 (no indirect gathers) runs every chunk in the units' own loops whatever
    the rows ask; the HND layout's gathers take the rounds too."""
    args = make_prefill_case(rng, [40, 40, 33, 40], [1000] * 4, 16, 2, 4, 32, layout=layout)
    with simulate.use_target(target):
        check(args, causal=True)
        assert (_rounds_run() > 0) == (target == "trn2")
