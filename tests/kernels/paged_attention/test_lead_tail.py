"""Each lead group of whole units (the cores' longest, folded without a device loop) may take
more tail slots than the launch's other units (``work.lead_tail_slots``): its units' chunks
then fold in the tail instead of loops. Checked: the host's choice per group (taken only when
larger and cheaper, over both cores' groups, each position's slots as the tail profile will
shrink them), the rows it writes, and the kernel against the reference with the choice on and
off."""

import numpy as np
import pytest

from nki_kernels import simulate
from nki_kernels.paged_attention import plan, work
from nki_kernels.paged_attention.work import (C0, C1, FULL_HI, FULL_LO, META_COLS,
                                              lead_tail_slots, with_rounds, with_unit_tail)
from nki_kernels.profile import estimate

from .conftest import statics_spy
from .test_prefill import check, make_prefill_case


def _rows(ends):
    """Untailed rows of units over chunks [0, e), the last one masked (the causal edge)."""
    rows = []
    for e in ends:
        row = np.zeros(META_COLS, np.int64)
        row[C0], row[FULL_LO], row[FULL_HI], row[C1] = 0, 0, e - 1, e
        rows.append(row)
    return rows


def _choice(ends, spans, lead, slots=4, sizes=(8,), per=4, mode="off", menu=(2, 3, 4, 8)):
    untailed = _rows(ends)
    tailed = [with_unit_tail(row, slots, 16, rounds=True) for row in untailed]
    return lead_tail_slots(tailed, untailed, np.array(spans), per, lead, slots, sizes, mode,
                           menu)


ONE_CORE = [[0, 8, 0, 0]]


def test_long_units_in_the_first_lead_group_take_the_longer_tail():
    """Four units of 7-8 chunks among four of 1-3 (one core, a lead group of four): with four
    slots the long ones would each loop over their first chunks; eight fold them all."""
    assert _choice((3, 8, 2, 7, 1, 8, 2, 7), ONE_CORE, 5) == (8,)


TWELVE = [[0, 12, 0, 0]]


def test_each_lead_group_chooses_its_own_tail():
    """Two lead groups of four over 6-8 chunks and four short units: both groups fold their
    units in eight slots, which three slots would loop over."""
    assert _choice((8, 8, 7, 7, 7, 6, 6, 6, 1, 2, 1, 2), TWELVE, 8, 3, (4, 8)) == (8, 8)


def test_each_unit_counts_its_own_empty_slots():
    """LNC=2, a lead group of two a core: a position holds a 10-chunk unit on one core and a
    4-chunk one on the other; eight slots there leave the short one four empty, which its
    neighbour's need does not excuse: the launch keeps its four."""
    spans = [[0, 3, 0, 0], [3, 5, 0, 0]]
    assert _choice((14, 4, 2, 12, 10), spans, 2, per=2, mode="lead") == ()


def test_a_groups_choice_counts_the_slots_its_profile_keeps():
    """The second group's units need 6, 6, 3, 3 chunks: eight slots each leave ten empty (the
    launch keeps three); a profile that halves the short units' tails leaves four."""
    ends = (8, 8, 7, 7, 6, 6, 3, 3, 1, 2, 1, 2)
    assert _choice(ends, TWELVE, 8, 3, (4, 8)) == (8,)
    assert _choice(ends, TWELVE, 8, 3, (4, 8), mode="lead") == (8, 8)


@pytest.mark.parametrize("ends, spans, lead, sizes, slots", [
    ((3, 2, 2, 1, 3, 2, 1, 1), ONE_CORE, 5, (8,), 4),      # short units: four slots hold them
    ((3, 8, 2, 7, 1, 8, 2, 7), ONE_CORE, 0, (8,), 4),      # no lead group: a loop runs them all
    ((3, 8, 2, 7, 1, 8, 2, 7), ONE_CORE, 5, (2, 4), 4),    # no size above the launch's
    ((3, 8, 2, 7, 1, 8, 2, 7), ONE_CORE, 5, (8,), 0),      # no tails at all
])
def test_the_launchs_tail_stays_otherwise(ends, spans, lead, sizes, slots):
    assert _choice(ends, spans, lead, slots, sizes) == ()


def test_both_cores_first_groups_choose_together():
    """LNC=2, two units a core in its lead group: one static size serves both cores, weighed
    over both first groups (core 0's pay its empty slots)."""
    spans = [[0, 4, 0, 0], [4, 8, 0, 0]]
    assert _choice((5, 4, 1, 1, 8, 8, 7, 2), spans, 2, per=2) == (8,)
    # core 0's two short units (ten empty slots more) outweigh core 1's one long unit's loop
    assert _choice((2, 2, 1, 1, 8, 2, 1, 1), spans, 2, per=2) == ()


def test_rows_of_the_first_lead_group_fold_every_chunk_in_the_tail():
    untailed = _rows((8, 8, 7, 7, 3, 2, 2, 1))
    tailed = [with_unit_tail(row, 4, 16, rounds=True) for row in untailed]
    spans = np.array(ONE_CORE)
    out = with_rounds(list(tailed), spans, 4, 16, 8, 1, untailed=list(untailed), slots=4,
                      lead=4, lead_tail=(8,))
    assert [int(r[C1]) for r in out[:4]] == [0, 0, 0, 0]       # no loop: all in the tail
    assert [int(r[FULL_HI]) for r in out[:4]] == [0, 0, 0, 0]
    assert [int(r[C1]) for r in out[4:]] == [0, 0, 0, 0]       # four slots hold the rest
    plain = with_rounds(list(tailed), spans, 4, 16, 8, 1, untailed=list(untailed), slots=4,
                        lead=4)
    assert [int(r[C1]) for r in plain[:4]] == [4, 4, 4, 4]     # their first chunks loop


def _barriers(target):
    return sum(estimate(simulate.last_trace(), target).schedule.barriers.values())


@pytest.mark.sim_only
@pytest.mark.parametrize("target, lnc", [("trn2", 1), ("trn2", 2), ("trn1", 1)])
def test_a_longer_lead_tail_matches_the_reference_with_fewer_barriers(rng, monkeypatch,
                                                                      target, lnc):
    """Eight chunks of 40 queries, four over 7-8 chunks of keys and four over 1-3 (odd
    lengths, page 16): the launch with the lead group's longer tail (trn2; NeuronCore-v2 has
    no tails) and the one without agree with the reference, the first with fewer loop
    barriers."""
    args = make_prefill_case(rng, [40, 37, 40, 40, 40, 33, 40, 40],
                             [1000, 300, 990, 257, 911, 129, 897, 77], 16, 2, 4, 32)
    taken = statics_spy(monkeypatch, plan.TAIL_PROFILE)
    with simulate.use_target(target):
        longer, _ = check(args, causal=True, lnc=lnc)
        barriers = _barriers(target)
        monkeypatch.setattr(work, "lead_tail_slots", lambda *a: ())
        plain, _ = check(args, causal=True, lnc=lnc)
        if target == "trn2":
            assert barriers < _barriers(target)
    # the first launch's lead group takes eight slots (its shorter units maybe four,
    # work.tail_profile); the second's takes none
    assert [8 in work.flat_sizes(p) for p in taken] == ([True, False] if target == "trn2"
                                                         else [False, False])
    np.testing.assert_allclose(longer, plain, rtol=1e-5, atol=1e-5)
