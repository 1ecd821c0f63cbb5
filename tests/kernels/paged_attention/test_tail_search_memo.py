"""``work.unit_tail_cost`` is memoized on a unit's bounds relative to its first chunk: the same
answers as the plain search, shifted with the unit, and a changed planning constant is a new
entry, not a stale one."""

import itertools

import pytest

from nki_kernels.paged_attention import work


def _plain(c0, lo, hi, c1, slots, rounds=False, taken=0):
    """The search written out: every tail start, its loops and empty slots, ties to the later."""
    loops = work._rounded_loop_cost if rounds else work._unit_loop_cost
    first, last = max(c0, c1 - slots), c1
    if taken:
        first, last = max(first, lo + taken), min(last, hi)
        if first > last:
            return None
    best = None
    for t in range(first, last + 1):
        cost = loops(c0, lo, hi, t - taken) + work.UNIT_TAIL_EMPTY_SLOT * (slots - c1 + t)
        if best is None or cost <= best[0]:
            best = (cost, t)
    return best


def test_memoized_search_matches_the_plain_one_and_shifts_with_the_unit():
    for n, lo, hi, slots, rounds, taken in itertools.product(
            range(1, 14), range(0, 6), range(0, 14), (1, 4, 8), (False, True), (0, 1, 3, 5)):
        if not lo <= hi <= n:
            continue
        want = _plain(0, lo, hi, n, slots, rounds, taken)
        assert work.unit_tail_cost(0, lo, hi, n, slots, rounds, taken) == want
        shifted = work.unit_tail_cost(37, lo + 37, hi + 37, n + 37, slots, rounds, taken)
        assert shifted == (None if want is None else (want[0], want[1] + 37))


def test_a_changed_constant_is_not_served_from_the_memo(monkeypatch):
    bounds = (0, 0, 12, 12, 4, True)
    with_rounds = work.unit_tail_cost(*bounds)
    monkeypatch.setattr(work, "ROUNDS_MAX", 0)
    monkeypatch.setattr(work, "ROUNDS1_MAX", 0)
    without = work.unit_tail_cost(*bounds)
    assert without == _plain(*bounds) and without[0] > with_rounds[0]
    monkeypatch.setattr(work, "UNIT_TAIL_EMPTY_SLOT", 5.0)
    assert work.unit_tail_cost(0, 0, 2, 2, 4) == pytest.approx((2 * 5.0 + 0, 0))
