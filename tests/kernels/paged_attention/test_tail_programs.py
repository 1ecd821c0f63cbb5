"""Exact tail sizes within a budget of programs a bucket (``tail_programs``,
``NKI_KERNELS_TAIL_PROGRAMS``): none by default; with a budget of K, a launch takes the sizes
its units need while its bucket has made fewer than K such programs, then one of those that
holds its units, else the default's. Checked: the host's choices and record, the cost that
decides them, and the kernel against the reference with a budget, its programs bounded."""

import numpy as np
import pytest

from nki_kernels import simulate
from nki_kernels.buckets import PROGRAMS_ENV, tail_programs
from nki_kernels.paged_attention import batch_decode_kernel, plan, tail_programs as programs
from nki_kernels.paged_attention.work import (C0, C1, FULL_HI, FULL_LO, LEN, META_COLS,
                                              UNIT_TAIL_EMPTY_SLOT, UNIT_TAIL_SLOT, tailed_units)

from .conftest import statics_spy
from .test_prefill import check, make_prefill_case

T = 128                                # keys a chunk (pages of 16)
ONE_CORE = np.array([[0, 12, 0, 0]])
SIZES = ((4, 8), (2, 3, 4, 8))         # the lead groups' sizes above three, the launch's menu
KEY = ("bucket",)


@pytest.fixture(autouse=True)
def _fresh():
    programs.forget()
    yield
    programs.forget()


def _units(chunks):
    """Untailed rows of units over chunks [0, n) each, the last masked (the causal edge)."""
    rows = []
    for n in chunks:
        row = np.zeros(META_COLS, np.int64)
        row[C0], row[FULL_LO], row[FULL_HI], row[C1] = 0, 0, n - 1, n
        row[LEN] = n * T - 5
        rows.append(row)
    return rows


def _choose(chunks, mode="off"):
    """(lead tails, profile) the budgeted choice gives twelve units on one core (two lead
    groups of four, three tail slots)."""
    _, lead_tail, profile = programs.choose(_units(chunks), ONE_CORE, 4, 8, 3, 16, 16, 1, mode,
                                            SIZES, KEY)
    return lead_tail, profile


SPREAD = (8, 8, 7, 7, 6, 6, 3, 3, 3, 2, 2, 1)


def test_no_budget_keeps_the_modes_choice(monkeypatch):
    monkeypatch.delenv(PROGRAMS_ENV, raising=False)
    assert tail_programs() == 0
    base = tailed_units(_units(SPREAD), ONE_CORE, 4, 8, 3, 16, 16, 1, "off", SIZES)
    assert _choose(SPREAD) == base[1:]
    assert programs.made(KEY) == []


def test_a_budget_takes_the_exact_sizes_and_records_them(monkeypatch):
    monkeypatch.setenv(PROGRAMS_ENV, "1")
    exact = tailed_units(_units(SPREAD), ONE_CORE, 4, 8, 3, 16, 16, 1, "exact", SIZES)
    assert _choose(SPREAD) == exact[1:]
    assert exact[2][1] == (6, 6, 3, 3)           # the second lead group's units need 6, 5, 3, 3
    assert programs.made(KEY) == [exact[2]]


def test_a_spent_budget_reuses_a_program_that_holds_the_units(monkeypatch):
    """The budget spent on the first pattern: a launch of shorter units reuses its sizes (every
    position holds them), one of longer units falls back to the mode's; nothing more made."""
    monkeypatch.setenv(PROGRAMS_ENV, "1")
    first = _choose(SPREAD)[1]
    shorter = (8, 7, 7, 6, 6, 5, 3, 2, 3, 2, 1, 1)
    assert _choose(shorter)[1] == first
    longer = (8, 8, 8, 8, 8, 8, 8, 8, 3, 3, 3, 3)
    base = tailed_units(_units(longer), ONE_CORE, 4, 8, 3, 16, 16, 1, "off", SIZES)
    assert _choose(longer) == base[1:]
    # five chunks where the first pattern keeps three slots: it would cost less, but does
    # not hold them
    mixed = (8, 8, 7, 7, 6, 6, 5, 5, 3, 2, 2, 1)
    base = tailed_units(_units(mixed), ONE_CORE, 4, 8, 3, 16, 16, 1, "off", SIZES)
    assert _choose(mixed) == base[1:] and base[2] != first
    assert programs.made(KEY) == [first]


def test_the_exact_sizes_only_when_they_cost_less(monkeypatch):
    """Units that fill the launch's tails exactly: the exact profile is the default's, and
    nothing is recorded."""
    monkeypatch.setenv(PROGRAMS_ENV, "4")
    even = (3,) * 12
    assert _choose(even) == ((), ())
    assert programs.made(KEY) == []


def test_the_cost_counts_empty_slots_and_loops():
    rows, lead_tail, profile = tailed_units(_units(SPREAD), ONE_CORE, 4, 8, 3, 16, 16, 1, "off",
                                            SIZES)
    exact = tailed_units(_units(SPREAD), ONE_CORE, 4, 8, 3, 16, 16, 1, "exact", SIZES)
    off = programs.plan_cost(rows, ONE_CORE, 4, 8, 3, profile, 16)
    tight = programs.plan_cost(exact[0], ONE_CORE, 4, 8, 3, exact[2], 16)
    assert tight < off
    assert programs.holds(exact[0], ONE_CORE, 4, 8, exact[2], 16)
    smaller = tuple(tuple(max(1, s - 1) for s in body) for body in exact[2])
    assert not programs.holds(exact[0], ONE_CORE, 4, 8, smaller, 16)
    # a slot more at every position of the three bodies: an empty slot for each of the twelve
    wider = tuple(tuple(s + 1 for s in body) for body in exact[2])
    extra = programs.plan_cost(exact[0], ONE_CORE, 4, 8, 3, wider, 16) - tight
    assert extra == pytest.approx(12 * (UNIT_TAIL_EMPTY_SLOT + UNIT_TAIL_SLOT))


def test_a_bad_budget_is_refused(monkeypatch):
    monkeypatch.setenv(PROGRAMS_ENV, "some")
    with pytest.raises(ValueError, match="NKI_KERNELS_TAIL_PROGRAMS"):
        tail_programs()


@pytest.mark.sim_only
@pytest.mark.parametrize("lnc", [1, 2])
def test_budgeted_launches_match_the_reference_within_their_programs(rng, monkeypatch, lnc):
    """Three launches of one bucket (twelve chunks of 40 queries over unlike prefixes, odd
    lengths) under a budget of one: each matches the reference; the bucket compiles the
    default's programs and one more at most, and some launch takes exact sizes."""
    monkeypatch.setenv(PROGRAMS_ENV, "1")
    profiles = statics_spy(monkeypatch, plan.TAIL_PROFILE)
    simulate.reset_compile_stats()
    for lens in ([1000, 300, 990, 257, 911, 129, 897, 77, 640, 520, 410, 45],
                 [900, 310, 700, 250, 880, 140, 600, 70, 620, 500, 400, 60],
                 [1010, 999, 980, 970, 960, 950, 940, 930, 900, 40, 41, 42]):
        args = make_prefill_case(rng, [40] * 12, lens, 16, 2, 4, 32)
        with simulate.use_target("trn2"):
            check(args, causal=True, lnc=lnc)
    compiled = simulate.compile_stats(batch_decode_kernel)["compilations"]
    monkeypatch.setenv(PROGRAMS_ENV, "0")
    programs.forget()
    plain = statics_spy(monkeypatch, plan.TAIL_PROFILE)
    simulate.reset_compile_stats()
    for lens in ([1000, 300, 990, 257, 911, 129, 897, 77, 640, 520, 410, 45],):
        args = make_prefill_case(rng, [40] * 12, lens, 16, 2, 4, 32)
        with simulate.use_target("trn2"):
            check(args, causal=True, lnc=lnc)
    assert profiles[0] != plain[0]               # the first launch took its exact sizes
    assert len(set(profiles)) <= 2 + 1 and compiled <= len(set(profiles))
