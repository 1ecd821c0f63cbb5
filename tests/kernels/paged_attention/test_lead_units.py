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


def test_lead_units_is_a_cores_share_of_the_buckets_least_size_in_whole_groups():
    assert work.lead_units(16, 1, True, 4) == 8          # 9..16 units: two groups of 4
    assert work.lead_units(16, 2, True, 4) == 4          # each core at least 4 of 9
    assert work.lead_units(8, 1, True, 4) == 4
    assert work.lead_units(8, 2, True, 4) == 0           # 5 units: 2 a core, no whole group
    assert work.lead_units(32, 1, True, 1) == 17         # NeuronCore-v2: groups of one
    assert work.lead_units(16, 1, False, 4) == 0         # not whole units
    old = set_bucket_policy(BucketPolicy(exact=True))
    try:
        assert work.lead_units(10, 1, True, 4) == 8
    finally:
        set_bucket_policy(old)


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
    group = 1 if target == "trn1" else 4                # whole units a loop iteration takes
    assert leads == [9 // lnc // group * group] * 2 + [0] * 2
    assert barriers[True, 9] < barriers[False, 9]
    assert barriers[True, 16] < barriers[False, 16]
