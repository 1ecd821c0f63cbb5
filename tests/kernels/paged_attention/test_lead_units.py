"""Whole units a bucket guarantees run without a device loop (work.lead_units): the same program
for every launch of the bucket, each core holding at least that many under LNC=2, and every
output the reference's."""

import numpy as np
import pytest

from nki_kernels import simulate
from nki_kernels.buckets import BucketPolicy, set_bucket_policy
from nki_kernels.paged_attention import batch_decode_kernel, plan, work
from nki_kernels.profile import estimate

from .conftest import statics_spy
from .test_prefill import check, make_prefill_case


def test_lead_units_is_a_cores_share_of_the_buckets_least_size():
    assert work.lead_units(16, 1, True, 4) == 8          # 9..16 units: two whole groups
    assert work.lead_units(16, 1, True, 8) == 8
    assert work.lead_units(16, 2, True, 4) == 4          # each core at least 4 of 9
    assert work.lead_units(8, 1, True, 4) == 4           # 5..8: one group, the rest loops
    assert work.lead_units(8, 2, True, 4) == 2           # 5 units: 2 a core
    assert work.lead_units(4, 1, True, 4) == 2           # 3..4: one group of two
    assert work.lead_units(16, 1, False, 4) == 0         # not whole units
    old = set_bucket_policy(BucketPolicy(exact=True))
    try:                                                 # no smaller launch shares the bucket:
        assert work.lead_units(10, 1, True, 4) == 10     # every unit, part groups included
        assert work.lead_units(12, 2, True, 4) == 6
        assert work.lead_units(9, 2, True, 4) == 4
    finally:
        set_bucket_policy(old)


@pytest.mark.parametrize("lead, per, groups", [
    (8, 4, [4, 4]), (8, 8, [8]), (4, 4, [4]), (2, 4, [2]),   # whole groups, then the rest in
    (9, 4, [4, 4, 1]), (6, 4, [4, 2]), (7, 4, [4, 2, 1]),    # powers of two, largest first
    (3, 4, [2, 1]), (7, 8, [4, 2, 1]), (0, 4, []),
    (17, 1, [1] * 17)])                                      # (NeuronCore-v2: ones)
def test_lead_groups_are_whole_groups_then_powers_of_two(lead, per, groups):
    assert work.lead_groups(lead, per) == groups


@pytest.mark.parametrize("units, lead, groups", [
    (5, 2, [(0, 2), (2, 2)]), (3, 2, [(0, 2)]), (6, 2, [(0, 2), (2, 4)]),
    (9, 4, [(0, 4), (4, 4)]), (2, 2, [(0, 2)])])
def test_unit_groups_begin_with_the_lead_groups(units, lead, groups):
    """The host's rounds follow the kernel's groups: the lead groups, then the loops' groups
    of four, two (a unit left alone takes none)."""
    assert work.unit_groups(0, units, 4, lead) == groups


def test_unit_groups_refuse_a_core_short_of_its_lead_units():
    """The kernel runs the lead groups whatever the core holds: tables for fewer units would
    have it fold rows past the core's own, so the host stops there instead."""
    with pytest.raises(AssertionError, match="fewer than the 4"):
        work.unit_groups(3, 6, 4, 4)


def test_two_cores_each_take_at_least_the_lead_units():
    chunks = np.array([40, 1, 1, 1, 1, 1, 1, 1, 1])
    kinds = np.zeros((9, len(work.ITEM_CLASSES)), np.int64)
    free, _ = work._whole_halves(chunks, kinds, 1, False, 4, 16)
    held, _ = work._whole_halves(chunks, kinds, 1, False, 4, 16, least=4)
    assert min(free.sum(), 9 - free.sum()) < 4          # the balance alone would not
    assert min(held.sum(), 9 - held.sum()) >= 4


def _same_pages(q_lens, pages, page_size=16):
    """Keys per request (at least its queries, odd lengths) filling ``pages`` pages in all."""
    share = [pages // len(q_lens) + (b < pages % len(q_lens)) for b in range(len(q_lens))]
    return [max(q, page_size * p - 1 - b % 5) for b, (q, p) in enumerate(zip(q_lens, share))]


def _barriers(trace, target):
    """Loop-iteration barriers of the launch's busier core (the cost model's count)."""
    return max(estimate(trace, target).schedule.barriers.values(), default=0)


@pytest.mark.sim_only
@pytest.mark.parametrize("lnc, target", [(1, "trn1"), (1, "trn2"), (2, "trn2")])
def test_a_bucket_compiles_once_and_its_lead_groups_need_no_loop(rng, lnc, target, monkeypatch):
    """Nine and sixteen blocks of queries (one bucket) give the same program, both match the
    reference, and with the lead groups the launch pays fewer loop barriers than with none."""
    barriers, leads = {}, statics_spy(monkeypatch, plan.LEAD_UNITS)
    for lead in (True, False):
        if not lead:
            monkeypatch.setattr(plan, "lead_units", lambda *a: 0)
        simulate.reset_compile_stats()
        for n in (9, 16):
            q_lens = [40 + 7 * (b % 3) for b in range(n)]
            kv_lens = _same_pages(q_lens, 140)   # one cache shape for both launches
            args = make_prefill_case(rng, q_lens, kv_lens, 16, 2, 4, 32)
            with simulate.use_target(target):
                check(args, lnc=lnc, causal=True)
                barriers[lead, n] = _barriers(simulate.last_trace(), target)
        assert simulate.compile_stats(batch_decode_kernel)["compilations"] == 1
    # whole groups of a bucket of 16 (nine units at least): one-unit groups on NeuronCore-v2,
    # eight on trn2 (four a core under LNC=2)
    assert leads == [{"trn1": 9, "trn2": 8}[target] // lnc] * 2 + [0] * 2
    assert barriers[True, 9] < barriers[False, 9]
    assert barriers[True, 16] < barriers[False, 16]


@pytest.mark.sim_only
@pytest.mark.parametrize("lnc, n", [(1, 7), (2, 12), (2, 7)])
def test_exact_buckets_fold_every_unit_without_a_loop(rng, lnc, n):
    """A bucket no smaller launch shares (exact bucketing) folds all its units in lead groups,
    part groups too: no loop barrier, and the outputs are the reference's (under LNC=2 an
    odd count leaves one unit to the loop)."""
    old = set_bucket_policy(BucketPolicy(exact=True))
    try:
        q_lens = [40 + 7 * (b % 3) for b in range(n)]
        kv_lens = [q + 30 * b + 3 for b, q in enumerate(q_lens)]
        args = make_prefill_case(rng, q_lens, kv_lens, 16, 2, 4, 32)
        with simulate.use_target("trn2"):
            check(args, lnc=lnc, causal=True)
            barriers = _barriers(simulate.last_trace(), "trn2")
    finally:
        set_bucket_policy(old)
    assert barriers == (1 if n % lnc else 0)


def test_groups_of_eight_only_when_each_core_is_sure_of_eight():
    """Units of 64 queries of a Llama-3-8B layer (16 tiles of 128 rows, bf16): eight a loop
    iteration when the bucket's least size gives each core eight, else four; wider units stop
    at what WHOLE_GROUP_BYTES holds; NeuronCore-v2 one."""
    assert work.whole_group_units(16, 128, 128, 2, 3, 9) == 8
    assert work.whole_group_units(16, 128, 128, 2, 3, 7) == 4
    assert work.whole_group_units(16, 128, 128, 2, 3) == 4
    assert work.whole_group_units(32, 128, 128, 2, 3, 16) == 4      # 25 KiB a unit
    assert work.whole_group_units(16, 128, 128, 2, 2, 16) == 1


@pytest.mark.sim_only
@pytest.mark.parametrize("lnc", [1, 2])
def test_a_group_of_eight_matches_the_reference_and_groups_of_four(rng, monkeypatch, lnc):
    """Twelve chunks of 64 queries, eight over like prefixes (bucket 16, at least 9: on one
    core a lead group of eight, whose rounds one loop runs; on two four a core): the outputs
    match the reference and the launch with groups of four at most, which on one core runs
    more loop iterations."""
    kv_lens = [1250, 1240, 1230, 1220, 1210, 1200, 1190, 1180, 900, 700, 480, 330]
    args = make_prefill_case(rng, [64] * 12, kv_lens, 16, 2, 4, 32)
    groups, group_units = [], plan.whole_group_units
    monkeypatch.setattr(plan, "whole_group_units",
                        lambda *a: groups.append(group_units(*a)) or groups[-1])
    with simulate.use_target("trn2"):
        eight, _ = check(args, causal=True, lnc=lnc)
        loops = _iterations(simulate.last_trace())
        monkeypatch.setattr(work, "WHOLE_UNITS_PER_ITERATION", 4)
        simulate.reset_compile_stats()     # a module constant changed: another program
        four, _ = check(args, causal=True, lnc=lnc)
        fewer = loops < _iterations(simulate.last_trace())
    assert groups == ([8, 4] if lnc == 1 else [4, 4])
    assert fewer == (lnc == 1)             # the kernel groups as the host planned
    np.testing.assert_allclose(eight, four, rtol=1e-5, atol=1e-5)


def _iterations(trace):
    return sum(loop["iterations"] for loop in trace.loops)


@pytest.mark.sim_only
@pytest.mark.parametrize("n", [5, 6])
def test_two_cores_sure_of_two_units_each_run_a_group_of_two_without_a_loop(rng, n,
                                                                            monkeypatch):
    """A bucket of 5-8 blocks of queries on two cores (each core sure of two; loop iterations
    take four): a lead group of two a core, which saves the two cores loop barriers, and every
    output the reference's."""
    barriers, leads = {}, statics_spy(monkeypatch, plan.LEAD_UNITS)
    q_lens = [40 + 7 * (b % 3) for b in range(n)]
    args = make_prefill_case(rng, q_lens, _same_pages(q_lens, 90), 16, 2, 4, 32)
    for lead in (True, False):
        if not lead:
            monkeypatch.setattr(plan, "lead_units", lambda *a: 0)
        with simulate.use_target("trn2"):
            check(args, lnc=2, causal=True)
            barriers[lead] = sum(estimate(simulate.last_trace(), "trn2")
                                 .schedule.barriers.values())
    assert leads == [2, 0]
    assert barriers[True] < barriers[False]


@pytest.mark.parametrize("bucket, cores, lead, levels", [
    (16, 1, 8, {9: 8, 11: 8, 12: 12, 15: 12, 16: 16}),    # halfway (12) and the top (16)
    (16, 2, 4, {9: 4, 11: 4, 12: 6, 13: 6, 16: 8}),
    (8, 1, 4, {5: 4, 6: 6, 7: 6, 8: 8}),
    (8, 2, 2, {5: 2, 6: 2, 7: 2, 8: 4}),                  # steps of two: no lead group of one
    (32, 1, 16, {17: 16, 23: 16, 24: 24, 31: 24, 32: 32}),
    (16, 1, 9, {9: 9, 12: 9, 13: 13, 15: 13, 16: 16}),    # one unit a group (NeuronCore-v2)
    (16, 1, 0, {12: 0})])                                 # no lead stays none
def test_a_launch_lead_takes_the_levels_its_units_reach(bucket, cores, lead, levels):
    for units, want in levels.items():
        assert work.launch_lead(lead, bucket, cores, units) == want


def test_the_lead_mode_is_read_from_the_environment(monkeypatch):
    from nki_kernels.buckets import LEAD_ENV, lead_mode
    monkeypatch.delenv(LEAD_ENV, raising=False)
    assert lead_mode() == "bucket"
    monkeypatch.setenv(LEAD_ENV, "launch")
    assert lead_mode() == "launch"
    monkeypatch.setenv(LEAD_ENV, "exact")
    with pytest.raises(ValueError, match="NKI_KERNELS_LEAD='exact' must be one of bucket"):
        lead_mode()


@pytest.mark.sim_only
@pytest.mark.parametrize("lnc, n, leads, fewer", [
    (1, 11, [8, 8], False), (1, 13, [8, 12], True), (2, 12, [4, 6], True),
    (2, 13, [4, 6], False), (2, 16, [4, 8], True)])
def test_a_launch_lead_matches_the_reference_with_fewer_barriers(rng, monkeypatch, lnc, n,
                                                                 leads, fewer):
    """``NKI_KERNELS_LEAD=launch``: a launch of a bucket of 16 that reaches a level past what
    the bucket guarantees folds that many units a core without a loop; every output is the
    reference's, with no more loop barriers than the bucket's own lead (fewer unless a core's
    last unit still loops: thirteen on two cores), and a launch that reaches none is the
    bucket's program (counts straddling the levels, odd key lengths)."""
    from nki_kernels.buckets import LEAD_ENV
    seen, barriers = statics_spy(monkeypatch, plan.LEAD_UNITS), {}
    q_lens = [40 + 7 * (b % 3) for b in range(n)]
    kv_lens = [q + 23 * b + 5 for b, q in enumerate(q_lens)]
    args = make_prefill_case(rng, q_lens, kv_lens, 16, 2, 4, 32)
    for mode in ("bucket", "launch"):
        monkeypatch.setenv(LEAD_ENV, mode)
        with simulate.use_target("trn2"):
            check(args, lnc=lnc, causal=True)
            barriers[mode] = _barriers(simulate.last_trace(), "trn2")
    assert seen == leads
    assert barriers["launch"] <= barriers["bucket"] - fewer
