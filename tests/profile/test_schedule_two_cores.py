"""LNC=2 in the schedule: the two cores order each other only at their synchronising instructions,
and the modelled time of a launch does not depend on how the simulator's threads interleaved."""

import threading
import time

import numpy as np
import pytest

from nki_kernels import simulate
from nki_kernels.profile import estimate
from nki_kernels.simulate import jit, nisa, nl
from nki_kernels.simulate.trace import Trace

from .test_schedule import hbm, load, slot_of, tile, vector

C0, C1 = (0,), (1,)


def barrier(trace, pid, n=0):
    return trace.add(op="core_barrier", engine="gpsimd", program_id=pid,
                     operands=(hbm("data", n=16, ident=90),), partitions=1, free_elems=16,
                     details={"sync": ("barrier", n)})


def test_cores_do_not_wait_for_each_others_memory_without_a_sync():
    trace = Trace(simulate.get_target("trn2"))
    a = load(trace, hbm("dst", ident=7), tile("src"), pid=C0)      # both write one HBM range:
    b = load(trace, hbm("dst", ident=7), tile("src", ident=5), pid=C1)   # no semaphore between
    est = estimate(trace)
    assert slot_of(est, a.index).start == 0 and slot_of(est, b.index).start == 0
    assert est.seconds == pytest.approx(slot_of(est, a.index).end)


def test_core_barrier_starts_when_both_cores_have_drained_and_holds_what_follows():
    trace = Trace(simulate.get_target("trn2"))
    long_work = [vector(trace, tile("dst", ident=20 + i), tile("data", ident=30 + i), pid=C0)
                 for i in range(6)]
    short = vector(trace, tile("dst", ident=40), tile("data", ident=41), pid=C1)
    b0, b1 = barrier(trace, C0), barrier(trace, C1)
    after = vector(trace, tile("dst", ident=42), tile("data", ident=43), pid=C1)
    est = estimate(trace)
    drained = slot_of(est, long_work[-1].index).end
    assert drained > 5 * slot_of(est, short.index).end
    s0, s1 = slot_of(est, b0.index), slot_of(est, b1.index)
    assert s0.start == s1.start == pytest.approx(drained)
    assert slot_of(est, after.index).start == pytest.approx(s1.end)
    assert slot_of(est, after.index).reason == "core barrier"


def test_sendrecv_starts_when_both_sources_are_ready():
    trace = Trace(simulate.get_target("trn2"))
    slow = load(trace, tile("dst", ident=50), hbm("src", ident=51), pid=C0)
    sends = []
    for pid, src in ((C0, 50), (C1, 52)):
        sends.append(trace.add(op="sendrecv", engine="dma", program_id=pid,
                               operands=(tile("dst", ident=src + 10), tile("src", ident=src)),
                               dma_bytes=128 * 2048, dma_runs=128,
                               details={"sync": ("sendrecv", 0, 0)}))
    est = estimate(trace)
    ready = slot_of(est, slow.index).end
    assert [slot_of(est, s.index).start for s in sends] == [pytest.approx(ready)] * 2
    assert slot_of(est, sends[1].index).reason == "other core"


def _events(trace):
    return [(e.op, e.program_id, e.dma_bytes, tuple(o.role for o in e.operands)) for e in trace]


@jit
def _exchange(x):
    """Each core: a few loads and stores of its half, a barrier, the other half read back."""
    n = x.shape[0] // 2
    me = nl.program_id(0)
    shared = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
    t = nl.ndarray((n, x.shape[1]), x.dtype, buffer=nl.sbuf)
    for _ in range(3):
        nisa.dma_copy(dst=t, src=x[me * n:(me + 1) * n, :])
        nisa.dma_copy(dst=shared[me * n:(me + 1) * n, :], src=t)
    nisa.core_barrier(data=shared, cores=(0, 1))
    back = nl.ndarray((n, x.shape[1]), x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=back, src=shared[(1 - me) * n:(2 - me) * n, :])
    out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out[me * n:(me + 1) * n, :], src=back)
    return out


@pytest.mark.parametrize("late", [C0, C1])
def test_trace_order_and_modelled_time_do_not_depend_on_thread_timing(monkeypatch, late):
    """One program instance made to record late (sleeping before each event): the canonical
    trace and its estimate equal those of a run where the other one is late."""
    x = np.arange(64, dtype=np.float32).reshape(8, 8)
    runs = []
    for slow in (late, C1 if late == C0 else C0):
        add = Trace.add

        def delayed(self, slow=slow, add=add, **fields):
            if fields["program_id"] == slow and threading.current_thread().name != "MainThread":
                time.sleep(0.002)
            return add(self, **fields)

        monkeypatch.setattr(Trace, "add", delayed)
        out = simulate.simulate(_exchange[2], target="trn2")(x)
        monkeypatch.setattr(Trace, "add", add)
        np.testing.assert_array_equal(out, np.concatenate([x[4:], x[:4]]))
        trace = simulate.last_trace()
        runs.append((_events(trace), estimate(trace).seconds))
        assert [e.index for e in trace] == list(range(len(trace)))
    assert runs[0][0] == runs[1][0]
    assert runs[0][1] == runs[1][1]
    ops = [(op, pid) for op, pid, _, _ in runs[0][0]]
    cut = ops.index(("core_barrier", C1))          # every pre-barrier event, core 0's first
    assert ops[:cut + 1] == [(o, C0) for o in ["dma_copy"] * 6 + ["core_barrier"]] \
        + [(o, C1) for o in ["dma_copy"] * 6 + ["core_barrier"]]
