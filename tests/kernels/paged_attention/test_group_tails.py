"""A loop iteration's whole units choose their tail starts together with their rounds
(``work.group_tails``): a unit may leave tail slots empty so that the group's rounds take its
mask-free chunks instead of a loop iteration of its own. Checked: the choice against the
units' own best starts (never costlier, cheaper for unlike prefixes), its bounds (each start
within the unit's tail range, the rounds' chunks mask-free), the rows the host writes, and the
kernel against the reference with the choice on and off."""

import numpy as np
import pytest

from nki_kernels import simulate
from nki_kernels.paged_attention import work
from nki_kernels.paged_attention.work import (C0, C1, FULL_HI, FULL_LO, META_COLS, ROUND_CHUNKS,
                                              ROUND_SLOT, ROUNDS, ROUNDS1, SLOT0,
                                              UNIT_TAIL_EMPTY_SLOT, _unit_loop_cost,
                                              group_rounds_of, group_tails, with_rounds,
                                              with_unit_tail)

from .test_prefill import check, make_prefill_case


def _row(c0, lo, hi, c1):
    row = np.zeros(META_COLS, np.int64)
    row[C0], row[FULL_LO], row[FULL_HI], row[C1] = c0, lo, hi, c1
    return row


def _cost(rows, starts, fours, ones, slots):
    """Loop iterations of the group (rounds, then each unit's own) plus its empty tail slots
    at UNIT_TAIL_EMPTY_SLOT each: what ``group_tails`` minimises."""
    taken = fours * ROUND_CHUNKS + ones
    total = fours + ones
    for row, ts in zip(rows, starts):
        c0, lo, hi, c1 = (int(row[k]) for k in (C0, FULL_LO, FULL_HI, C1))
        total += (_unit_loop_cost(c0, min(lo, ts), max(lo, min(hi, ts)), ts - taken)
                  + UNIT_TAIL_EMPTY_SLOT * (slots - c1 + ts))
    return total


def _own_choice(rows, slots):
    """(ROUNDS, ROUNDS1, starts) when each unit takes its own best start first."""
    tailed = [with_unit_tail(row, slots, 16, rounds=True) for row in rows]
    fours, ones = group_rounds_of(tailed)
    return fours, ones, [int(row[C1]) for row in tailed]


@pytest.mark.parametrize("ends, expect", [
    ((13, 12, 11, 10), (2, 0, [9, 8, 8, 8])),     # eight chunks of each in two rounds
    ((9, 8, 7, 6), (1, 0, [5, 4, 4, 4])),
    ((7, 7, 7, 7), (1, 0, [4, 4, 4, 4])),          # like units: as before
])
def test_unlike_prefixes_share_the_groups_rounds(ends, expect):
    """Units whose last chunk is masked (the diagonal), tails of four slots."""
    rows = [_row(0, 0, e - 1, e) for e in ends]
    assert group_tails(rows, 4) == expect
    own = _own_choice(rows, 4)
    assert _cost(rows, expect[2], *expect[:2], 4) <= _cost(rows, own[2], *own[:2], 4)
    if len(set(ends)) > 1:
        assert _cost(rows, expect[2], *expect[:2], 4) < _cost(rows, own[2], *own[:2], 4)


def test_ties_go_to_fewer_rounds():
    """Two units of 6 chunks (tails of four): two rounds of one chunk cost what the units' own
    blocks of two do; the rounds are not taken."""
    assert group_tails([_row(0, 0, 6, 6), _row(0, 0, 6, 6)], 4) == (0, 0, [2, 2])


def test_a_unit_without_mask_free_chunks_keeps_the_group_from_rounds():
    rows = [_row(0, 0, 11, 12), _row(0, 0, 9, 10), _row(0, 0, 0, 1)]
    fours, ones, starts = group_tails(rows, 4)
    assert (fours, ones) == (0, 0) and starts[2] in (0, 1)


def test_starts_and_rounds_stay_in_bounds(rng):
    """Random groups (window starts, masked tails, short and long prefixes): each start within
    [max(C0, C1 - slots), C1], the rounds' chunks [ts - taken, ts) mask-free, and the choice
    never costlier than each unit's own start."""
    for _ in range(300):
        slots = int(rng.choice([1, 2, 4, 8]))
        rows = []
        for _ in range(int(rng.integers(2, 5))):
            c1 = int(rng.integers(0, 40))
            c0 = int(rng.integers(0, c1 + 1)) if rng.random() < 0.2 else 0
            lo = int(rng.integers(c0, c1 + 1)) if rng.random() < 0.3 else c0
            hi = int(rng.integers(lo, c1 + 1))
            rows.append(_row(c0, lo, hi, c1))
        fours, ones, starts = group_tails(rows, slots)
        taken = fours * ROUND_CHUNKS + ones
        for row, ts in zip(rows, starts):
            c0, lo, hi, c1 = (int(row[k]) for k in (C0, FULL_LO, FULL_HI, C1))
            assert max(c0, c1 - slots) <= ts <= c1
            assert not taken or lo <= ts - taken and ts <= hi
        own = _own_choice(rows, slots)
        assert _cost(rows, starts, fours, ones, slots) <= _cost(rows, own[2], *own[:2], slots) + 1e-9


def test_rows_take_the_groups_starts_and_rounds():
    rows = [_row(0, 0, e - 1, e) for e in (13, 12, 11, 10)]
    for row in rows:
        row[SLOT0] = 100
    spans = np.array([[0, 4, 0, 0]])
    tailed = [with_unit_tail(row, 4, 16, rounds=True) for row in rows]
    out = with_rounds(tailed, spans, 4, 16, 4, 1, untailed=list(rows), slots=4)
    assert [int(r[C1]) for r in out] == [9, 8, 8, 8]
    assert [int(r[FULL_HI]) for r in out] == [9, 8, 8, 8]
    assert all((int(r[ROUNDS]), int(r[ROUNDS1])) == (2, 0) for r in out)
    for r in out:                        # the first round: the four chunks before the tail
        assert r[ROUND_SLOT] == 100 + (r[C1] - ROUND_CHUNKS) * 8


@pytest.mark.parametrize("target, lnc", [("trn2", 1), ("trn2", 2), ("trn1", 1)])
def test_group_tails_match_the_reference_and_the_units_own_starts(rng, monkeypatch, target,
                                                                  lnc):
    """Chunks of 40 queries over unlike prefixes (page 16): the launch with the group's starts
    and the one with each unit's own agree with the reference."""
    args = make_prefill_case(rng, [40, 40, 40, 40, 33, 40, 40, 40],
                             [1000, 1100, 1250, 1400, 700, 900, 1300, 1550], 16, 2, 4, 32)
    with simulate.use_target(target):
        together, _ = check(args, causal=True, lnc=lnc)
        iterations = _loop_iterations()
        monkeypatch.setattr(work, "GROUP_TAILS", False)
        apart, _ = check(args, causal=True, lnc=lnc)
        if target == "trn2":             # (NeuronCore-v2 runs no rounds: no gathers by rows)
            assert iterations < _loop_iterations()
    np.testing.assert_allclose(together, apart, rtol=1e-5, atol=1e-5)


def _loop_iterations():
    return sum(loop["iterations"] for loop in simulate.last_trace().loops)
