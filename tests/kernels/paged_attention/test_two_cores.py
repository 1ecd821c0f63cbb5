"""LNC=2 decode: the step's chunks cut into two equal halves, the request at the cut split between
the cores (split-KV) and its partial softmax states merged on device."""

from collections import Counter

import numpy as np
import pytest

from nki_kernels import simulate
from nki_kernels.paged_attention import batch_decode, batch_decode_ref
from nki_kernels.paged_attention import work
from nki_kernels.profile import estimate
from nki_kernels.paged_attention.work import (C0, C1, ITEM_COST_CHUNKS,
                                                     ITERATION_COST_CHUNKS, OUT, chunk_tokens,
                                                     core_rows, decode_work, state_slots)

from .conftest import assert_close, make_decode_case

pytestmark = pytest.mark.sim_only


def _work(lens, page_size=16, window_left=-1, rows=None):
    counts = [-(-n // page_size) for n in lens]
    indptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    return decode_work(indptr, np.array(lens), window_left, page_size, rows or max(1, len(lens)), 2,
                       1)


def _chunks_by_request(work, page_size=16):
    """{request: sorted chunk ranges} over both cores' items."""
    got = {}
    for core, span in enumerate(work.spans):
        for i in core_rows(span, 1):
            row = work.items[i]
            if row[C1] > row[C0]:
                got.setdefault(int(row[OUT]), []).append((int(row[C0]), int(row[C1])))
    return {b: sorted(r) for b, r in got.items()}


@pytest.mark.parametrize("lens", [[32768], [5000, 10, 10, 10], [100] * 8, [1, 2000, 3, 900, 17],
                                  [0, 0, 130], [128]])
def test_work_covers_every_chunk_once_and_balances(lens):
    work = _work(lens)
    T = chunk_tokens(16)
    for b, ranges in _chunks_by_request(work).items():
        flat = [c for lo, hi in ranges for c in range(lo, hi)]
        assert flat == list(range(0, -(-lens[b] // T))), (b, ranges)
    assert set(_chunks_by_request(work)) == {b for b, n in enumerate(lens) if n}
    # the two halves differ by at most one item's work
    assert abs(work.loads[0] - work.loads[1]) <= 1 + ITERATION_COST_CHUNKS + ITEM_COST_CHUNKS


def test_a_single_long_request_is_split_in_halves():
    work = _work([32768])
    halves = [sorted(c for i in core_rows(work.spans[p], 1)
                     for c in range(work.items[i][C0], work.items[i][C1])) for p in (0, 1)]
    assert halves == [list(range(0, 128)), list(range(128, 256))]
    assert work.spans[:, -2].tolist() == [1, 2]           # each core's part in its own slot


def test_an_empty_batch_has_no_items():
    work = decode_work(np.zeros(1, np.int32), np.zeros(0), -1, 16, 1, 2)
    assert not work.items.any() and work.loads == (0.0, 0.0)
    assert (work.spans[:, -2] == state_slots(1) - 1).all()


CASES = [
    dict(lens=[3000], window_left=-1),                     # split-KV: one request over both cores
    dict(lens=[3000], window_left=1234),                   # split inside a window
    dict(lens=[700, 5, 0, 33, 129], window_left=-1),       # mixed, the long one split
    dict(lens=[64, 64, 64, 64], window_left=-1),           # even: the cut falls between requests
    dict(lens=[1], window_left=-1),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c['lens']}-w{c['window_left']}")
def test_lnc2_matches_reference(rng, case):
    args = make_decode_case(rng, case["lens"], 16, 2, 3, 32)
    kw = dict(window_left=case["window_left"], return_lse=True, logits_soft_cap=20.0)
    with simulate.use_target("trn2"):
        out, lse = batch_decode(*args, lnc=2, **kw)
    ref, ref_lse = batch_decode_ref(*args, **kw)
    assert_close(out, ref, lse, ref_lse)


@pytest.mark.parametrize("layout,fused,page_size", [("HND", False, 256), ("NHD", True, 1)])
def test_lnc2_layouts_and_sinks(rng, layout, fused, page_size):
    args = make_decode_case(rng, [1500, 40], page_size, 2, 2, 64, layout=layout, fused=fused)
    sinks = rng.standard_normal(4).astype(np.float32)
    with simulate.use_target("trn2"):
        out, lse = batch_decode(*args, lnc=2, sinks=sinks, return_lse=True)
    assert_close(out, *batch_decode_ref(*args, sinks=sinks, return_lse=True)[:1], lse,
                 batch_decode_ref(*args, sinks=sinks, return_lse=True)[1])


def _per_core(trace, op):
    return Counter(e.program_id for e in trace.events if e.op == op)


def test_one_long_request_uses_both_cores_evenly(rng):
    args = make_decode_case(rng, [4096], 16, 2, 2, 32)
    with simulate.use_target("trn2"):
        batch_decode(*args, lnc=2)
        matmuls = _per_core(simulate.last_trace(), "nc_matmul")
        one = batch_decode(*args, lnc=1)
        single = _per_core(simulate.last_trace(), "nc_matmul")
    assert set(matmuls) == {(0,), (1,)}
    assert matmuls[(0,)] == matmuls[(1,)]
    assert matmuls[(0,)] + matmuls[(1,)] == single[(0,)]          # the work is shared, not repeated
    assert one.shape == (1, 4, 32)


def _own_work_seconds(trace, est, core):
    """When ``core``'s last instruction before its exchange with the other core ends: its share
    of the step, without the wait for its partner that the exchange adds."""
    sync = min(e.index for e in trace if e.op == "sendrecv" and e.program_id == (core,))
    return max(s.end for s in est.schedule.slots if s.core == core and s.index < sync)


ONE_LONG_AMONG_ONE_PAGE = pytest.mark.xfail(
    strict=True, reason="the cut's chunk-equivalent costs misprice one-page items at this shape "
    "(2 kv heads of 32, fp32): one long request among 15 one-page ones leaves the cores 36 / 67 "
    "us of their own work")


@pytest.mark.parametrize("lens", [
    pytest.param([2048] + [16] * 15, marks=ONE_LONG_AMONG_ONE_PAGE),
    pytest.param([16] * 15 + [2048], marks=ONE_LONG_AMONG_ONE_PAGE),
    [300, 9, 1200, 64, 5], [700, 40, 1500, 900, 33, 260, 1200, 75]])
def test_mixed_batch_cores_are_equally_busy_in_the_cost_model(rng, lens, monkeypatch):
    """One long request among short ones in device loops: alternating requests would leave one
    core with the long one; the cut gives both cores the same modelled work (up to the exchange
    that merges the split request), within 15%."""
    monkeypatch.setattr(work, "STATIC_MAX_SLOTS", 0)      # the device loops (no static pass)
    args = make_decode_case(rng, lens, 16, 2, 2, 32)
    with simulate.use_target("trn2"):
        batch_decode(*args, lnc=2)
    trace = simulate.last_trace()
    est = estimate(trace)
    assert est.cores == 2
    times = [_own_work_seconds(trace, est, c) for c in (0, 1)]
    assert abs(times[0] - times[1]) <= 0.15 * max(times), times


def test_lnc2_needs_two_cores_of_trn2(rng):
    args = make_decode_case(rng, [40], 16, 2, 2, 32)
    with simulate.use_target("trn1"), pytest.raises(ValueError, match="lnc=2 needs a NeuronCore-v3"):
        batch_decode(*args, lnc=2)
    with pytest.raises(ValueError, match="lnc=3"):
        batch_decode(*args, lnc=3)
