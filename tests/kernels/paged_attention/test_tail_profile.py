"""Whole units' tail slots per unit position (``work.tail_profile``, the static kernel argument
``plan.TAIL_PROFILE``): a unit position of ``kernel.run_whole_units``' bodies takes fewer slots
when every core's unit there needs fewer. Checked: the host's profile in each mode (which
positions shrink, that the default's patterns stay few), and the kernel against the
reference with it, scoring fewer keys."""

import numpy as np
import pytest

from nki_kernels import simulate
from nki_kernels.buckets import tail_profile_mode
from nki_kernels.paged_attention.work import (C1, LEN, META_COLS, TAIL_SIZES, flat_sizes,
                                              tail_profile, unit_bodies)

from .test_prefill import check, make_prefill_case

T = 128                                # keys a chunk (pages of 16)


def _rows(chunks, starts=None):
    """Rows of units holding ``chunks`` chunks from their tail start (C1, 0 unless given)."""
    rows = []
    for k, n in enumerate(chunks):
        row = np.zeros(META_COLS, np.int64)
        row[C1] = 0 if starts is None else starts[k]
        row[LEN] = (row[C1] + n) * T - 5            # the last chunk partly filled
        rows.append(row)
    return rows


def _profile(chunks, spans, lead, slots=4, lead_tail=(), per=4, sizes=(2, 4, 8), mode="lead",
             starts=None):
    return tail_profile(_rows(chunks, starts), np.array(spans), per, lead, slots, lead_tail, 16,
                        sizes, mode)


TWO_CORES = [[0, 6, 0, 0], [6, 12, 0, 0]]


def test_the_lead_groups_short_units_take_half_the_slots():
    """LNC=2, a lead group of four a core (its longest units first): the positions where both
    cores' units fit in four of eight slots take four."""
    chunks = (8, 7, 3, 3, 2, 1) + (7, 6, 4, 2, 3, 2)
    assert _profile(chunks, TWO_CORES, 4, lead_tail=(8,)) == ((8, 8, 4, 4),)
    chunks = (8, 7, 5, 3, 2, 1) + (7, 6, 3, 3, 3, 2)    # a five: its position keeps eight
    assert _profile(chunks, TWO_CORES, 4, lead_tail=(8,)) == ((8, 8, 8, 4),)


def test_the_default_profile_falls_along_the_group():
    """A short unit before a long one (its core's order is by mask-free chunks, not by need)
    does not shrink alone: the sizes fall, so a group of n has n + 1 patterns at most."""
    chunks = (8, 3, 7, 2, 1, 1) + (8, 2, 6, 2, 1, 1)
    assert _profile(chunks, TWO_CORES, 4, lead_tail=(8,)) == ((8, 8, 8, 4),)


def test_the_default_profile_is_one_of_few_patterns(rng):
    seen = set()
    for _ in range(300):
        chunks = tuple(int(c) for c in rng.integers(1, 9, 12))
        profile = _profile(chunks, TWO_CORES, 4, lead_tail=(8,))
        assert len(profile) <= 1
        if profile:
            sizes = profile[0]
            assert all(a >= b for a, b in zip(sizes, sizes[1:])) and set(sizes) <= {4, 8}
        seen.add(profile)
    assert len(seen) <= 5


@pytest.mark.parametrize("chunks, sizes", [
    ((4, 4, 4, 4, 1, 1) + (4, 4, 4, 4, 1, 1), (2, 4, 8)),   # every lead unit needs the slots
    ((1, 1, 1, 1, 1, 1) + (1, 1, 1, 1, 1, 1), (4,)),        # NKI_KERNELS_TAIL_SLOTS=4: one size
])
def test_nothing_shrinks_and_the_profile_is_empty(chunks, sizes):
    """The kernel's default (every position the launch's slots) is the empty profile: no
    program more than before."""
    assert _profile(chunks, TWO_CORES, 4, sizes=sizes) == ()


def test_off_keeps_the_lead_groups_one_size():
    chunks = (8, 7, 5, 3, 2, 1) + (7, 6, 3, 3, 3, 2)
    assert _profile(chunks, TWO_CORES, 4, lead_tail=(8,), mode="off") == ((8, 8, 8, 8),)
    assert _profile(chunks, TWO_CORES, 4, mode="off") == ()


def test_exact_sizes_every_body_and_position():
    """Exact: each position the least of TAIL_SIZES holding its units, in every body (the
    lead group, the loop over pairs, the loop over single units; bodies after the last that
    differs from the launch's slots left out)."""
    chunks = (8, 7, 5, 3, 2, 1) + (7, 6, 6, 3, 3, 2)
    profile = _profile(chunks, TWO_CORES, 4, lead_tail=(8,), mode="exact")
    assert profile[0] == (8, 8, 6, 3)              # 7 -> 8, 6 -> 6 (no 5 nor 7 among the sizes)
    assert profile[2] == (3, 2)                    # the pair after the lead group, per position
    assert len(profile) <= unit_bodies(4, 4) and set(flat_sizes(profile)) <= set(TAIL_SIZES)


def test_a_units_chunks_count_from_its_tail_start():
    """Units whose first chunks loop before their tails (C1 > 0) need only the chunks after."""
    chunks = (3, 3, 2, 2, 1, 1) + (3, 3, 2, 2, 1, 1)
    starts = (5, 4, 9, 1, 0, 0) * 2
    assert _profile(chunks, TWO_CORES, 4, starts=starts, mode="exact")[0] == (3, 3, 2, 2)


def test_the_mode_comes_from_the_environment(monkeypatch):
    monkeypatch.delenv("NKI_KERNELS_TAIL_PROFILE", raising=False)
    assert tail_profile_mode() == "lead"
    monkeypatch.setenv("NKI_KERNELS_TAIL_PROFILE", "exact")
    assert tail_profile_mode() == "exact"
    monkeypatch.setenv("NKI_KERNELS_TAIL_PROFILE", "short")
    with pytest.raises(ValueError, match="NKI_KERNELS_TAIL_PROFILE='short' must be one of"):
        tail_profile_mode()


def _scored_keys():
    """Key columns the last launch's selections scored (range_select's free size, summed)."""
    return sum(e.free_elems * e.partitions for e in simulate.last_trace()
               if e.op in ("range_select", "select_reduce"))


@pytest.mark.sim_only
@pytest.mark.parametrize("lnc", [1, 2])
def test_profiles_match_the_reference_and_score_fewer_keys(rng, monkeypatch, lnc):
    """Twelve chunks of 33-40 queries over 41-1000 keys (odd lengths, page 16): every mode
    agrees with the reference; the default scores no more keys than one size a group, exact
    fewer still."""
    args = make_prefill_case(rng, [40, 37, 40, 40, 33, 40, 40, 39, 40, 35, 40, 40],
                             [1000, 300, 990, 257, 911, 129, 897, 77, 600, 41, 420, 833],
                             16, 2, 4, 32)
    scored = {}
    with simulate.use_target("trn2"):
        for mode in ("off", "lead", "ladder", "exact"):
            monkeypatch.setenv("NKI_KERNELS_TAIL_PROFILE", mode)
            check(args, causal=True, lnc=lnc)
            scored[mode] = _scored_keys()
    assert scored["exact"] < scored["off"] and scored["lead"] <= scored["off"]
    assert scored["exact"] <= scored["ladder"] < scored["off"]


def test_every_lead_group_takes_its_own_slots():
    """One core, two lead groups of four with their own tails (``lead_tail_slots``): each body
    shrinks from its own size; "off" keeps each at its size, a group with no tail of its own
    at the launch's slots."""
    chunks = (8, 7, 7, 6, 6, 5, 3, 3, 2, 1, 1, 1)
    one = [[0, 12, 0, 0]]
    assert _profile(chunks, one, 8, 3, lead_tail=(8, 6), sizes=(2, 3, 4, 8)) == (
        (8, 8, 8, 8), (6, 6, 3, 3))
    assert _profile(chunks, one, 8, 3, lead_tail=(8, 6), mode="off") == ((8,) * 4, (6,) * 4)
    assert _profile(chunks, one, 8, 3, lead_tail=(0, 8), mode="off") == ((3,) * 4, (8,) * 4)


def test_the_ladder_steps_down_by_eighths_of_the_groups_size():
    """"ladder": each position the least of the group's size and 6/8, 4/8, 3/8 of it (whole
    sizes of two slots or more) that its units fit, falling along the group; on one core too
    (the launch's "lead" keeps one size there)."""
    one = [[0, 12, 0, 0]]
    chunks = (8, 7, 6, 5, 4, 3, 3, 2, 2, 1, 1, 1)
    assert _profile(chunks, one, 8, 3, lead_tail=(8, 8), mode="ladder") == (
        (8, 8, 6, 6), (4, 3, 3, 3))
    assert _profile(chunks, one, 8, 3, lead_tail=(8, 4), mode="ladder") == (
        (8, 8, 6, 6), (4, 3, 3, 2))                  # 4: steps 3 and 2
    assert _profile((6, 5, 3, 2) + (1,) * 8, one, 4, 3, lead_tail=(6,), mode="ladder") == (
        (6, 6, 3, 3),)                               # 6: only 3 (4.5 and 2.25 are no sizes)
    chunks = (8, 5, 3, 1, 1, 1) + (7, 6, 4, 2, 3, 2)
    assert _profile(chunks, TWO_CORES, 4, lead_tail=(8,), mode="ladder") == ((8, 6, 4, 3),)
