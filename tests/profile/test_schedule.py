"""The dependency-aware schedule on hand-built traces: each rule made to bite, then real kernels."""

import numpy as np
import pytest

from nki_kernels import simulate
from nki_kernels.profile import TRN1, TRN2, estimate
from nki_kernels.profile.cost_model import compute_seconds
from nki_kernels.profile.schedule import descriptor_seconds, dma_transfer_seconds
from nki_kernels.simulate.trace import Operand, Trace

SB, HB = 1, 2          # buffer idents: an SBUF tile [128, 512] fp32, an HBM tensor


def tile(role, p0=0, parts=128, f0=0, free=512, ident=SB, indirect=None):
    """An fp32 view [parts, free] of SBUF tile ``ident`` (512 fp32 per partition)."""
    return Operand(role, "t", "sbuf", "float32", (parts, free), ((512, parts), (1, free)),
                   p0 * 512 + f0, indirect, ident, 2048)


def hbm(role, start=0, n=128 * 512, ident=HB, indirect=None):
    return Operand(role, "h", "shared_hbm", "float32", (n,), ((1, n),), start, indirect, ident)


def load(trace, dst, src, pid=(0,), **kw):
    nbytes = dst.nbytes
    return trace.add(op="dma_copy", engine="dma", program_id=pid, operands=(dst, src),
                     dma_bytes=nbytes, dma_runs=dst.shape[0], hbm_read_bytes=nbytes,
                     details=kw)


def vector(trace, *ops, free=512, pid=(0,)):
    return trace.add(op="tensor_scalar", engine="vector", program_id=pid, operands=ops,
                     partitions=128, free_elems=free)


def scalar(trace, *ops, pid=(0,)):
    return trace.add(op="activation", engine="scalar", program_id=pid, operands=ops,
                     partitions=128, free_elems=512, details={})


def slot_of(est, index, lane=None):
    return next(s for s in est.schedule.slots if s.index == index and (lane is None or s.lane == lane))


def test_read_after_write_waits_for_the_dma():
    trace = Trace(simulate.get_target("trn2"))
    d = load(trace, tile("dst"), hbm("src"))
    v = vector(trace, tile("dst", ident=3), tile("data"))
    est = estimate(trace)
    dma, vec = slot_of(est, d.index), slot_of(est, v.index)
    assert dma.start == 0 and dma.end == pytest.approx(TRN2.dma_fixed_s + dma_transfer_seconds(d, TRN2))
    assert vec.start == dma.end and vec.reason == "data"
    assert est.seconds == pytest.approx(vec.end)
    assert [est.schedule.slots[k].index for k in est.schedule.critical] == [d.index, v.index]


def test_independent_engines_overlap_and_one_engine_runs_in_order():
    trace = Trace(simulate.get_target("trn2"))
    a = vector(trace, tile("dst", ident=10), tile("data", ident=11))
    b = scalar(trace, tile("dst", ident=12), tile("data", ident=13))
    c = vector(trace, tile("dst", ident=14), tile("data", ident=15))
    est = estimate(trace)
    assert slot_of(est, b.index).start == 0                       # other engine: overlaps
    assert slot_of(est, c.index).start == slot_of(est, a.index).end   # same engine: after a
    assert slot_of(est, c.index).reason == "engine"
    assert est.seconds == pytest.approx(max(2 * compute_seconds(a, TRN2), compute_seconds(b, TRN2)))
    assert est.lower_seconds <= est.seconds <= est.serial_seconds


def test_write_after_read_waits_for_the_reader():
    """Reloading a tile that a vector op still reads must wait for the read to finish."""
    trace = Trace(simulate.get_target("trn2"))
    first = load(trace, tile("dst"), hbm("src"))
    use = vector(trace, tile("dst", ident=3), tile("data"))
    again = load(trace, tile("dst"), hbm("src", start=128 * 512))
    est = estimate(trace)
    assert slot_of(est, again.index).start == pytest.approx(slot_of(est, use.index).end)
    assert slot_of(est, again.index).reason == "data"
    assert slot_of(est, first.index).end <= slot_of(est, use.index).start


def test_disjoint_parts_of_one_tile_do_not_depend():
    trace = Trace(simulate.get_target("trn2"))
    top = load(trace, tile("dst", parts=64), hbm("src", n=64 * 512))
    bottom = vector(trace, tile("dst", ident=3, p0=64, parts=64), tile("data", p0=64, parts=64))
    left = vector(trace, tile("dst", ident=4, free=256), tile("data", free=256, f0=256, ident=5))
    est = estimate(trace)
    assert slot_of(est, bottom.index).start == 0                 # partitions 64.. untouched by DMA
    # the same partitions, other columns of another tile: waits only for its engine
    assert slot_of(est, left.index).reason == "engine"
    overlap = vector(trace, tile("dst", ident=6), tile("data", p0=0, parts=64, f0=100, free=8))
    edge = scalar(trace, tile("dst", ident=7, parts=1), tile("data", p0=63, parts=1))
    est = estimate(trace)
    assert slot_of(est, overlap.index).start >= slot_of(est, top.index).end
    assert slot_of(est, edge.index).start >= slot_of(est, top.index).end    # its last partition


def test_dma_queue_limit_and_engines():
    trace = Trace(simulate.get_target("trn2"))
    small = [load(trace, tile("dst", ident=100 + i, parts=8, free=16),
                  hbm("src", start=i * 128, n=128)) for i in range(17)]
    est = estimate(trace)
    starts = sorted(slot_of(est, e.index).start for e in small)
    assert starts[:16] == [0.0] * 16 and starts[16] > 0          # 16 in flight, the 17th waits
    assert slot_of(est, small[16].index).reason == "dma queue"
    est2 = estimate(trace, dma_queues_in_flight=32)
    assert all(slot_of(est2, e.index).start == 0 for e in small)
    assert est2.seconds < est.seconds
    # two full-width DMAs share the 16 engines: the second moves after the first
    trace = Trace(simulate.get_target("trn2"))
    a = load(trace, tile("dst", ident=200), hbm("src"))
    b = load(trace, tile("dst", ident=201), hbm("src", start=128 * 512))
    est = estimate(trace)
    assert slot_of(est, b.index).start == 0
    assert slot_of(est, b.index).end == pytest.approx(slot_of(est, a.index).end
                                                      + dma_transfer_seconds(b, TRN2))
    assert slot_of(est, b.index).reason == "dma engines"


def test_descriptor_generation():
    """Indirect DMAs: software DGE on GpSimd, in GpSimd's order. Dynamic (scalar offset) on
    NeuronCore-v3: hardware DGE, 600 ns on one of two units; on v2 software DGE."""
    trace = Trace(simulate.get_target("trn2"))
    gathers = [load(trace, tile("dst", ident=300 + i), hbm("src", indirect="vector"))
               for i in range(2)]
    est = estimate(trace)
    gen = [slot_of(est, g.index, "gpsimd") for g in gathers]
    assert gen[0].start == 0 and gen[1].start == gen[0].end          # one GpSimd, in order
    assert gen[0].end - gen[0].start == pytest.approx(descriptor_seconds(gathers[0], TRN2, "swdge"))
    assert slot_of(est, gathers[0].index, "dma").start == gen[0].end
    trace = Trace(simulate.get_target("trn2"))
    dyn = [load(trace, tile("dst", ident=400 + i, parts=1, free=8), hbm("src", indirect="scalar"))
           for i in range(3)]
    est = estimate(trace)
    gen = sorted(slot_of(est, d.index, "dge").start for d in dyn)
    assert gen == pytest.approx([0, 0, 600e-9])                       # two hardware DGE units
    on_trn1 = estimate(trace, target="trn1")
    assert all(slot_of(on_trn1, d.index, "gpsimd") for d in dyn)
    # a direct software-DGE DMA costs its GpSimd trigger only (the DMA overview's ~8 ns);
    # an indirect one also a descriptor per row (128 rows here)
    assert descriptor_seconds(dyn[0], TRN1, "swdge") == pytest.approx(10 / 1.4e9)
    assert descriptor_seconds(gathers[0], TRN1, "swdge") == pytest.approx(
        (10 + 8 * gathers[0].dma_runs) / 1.4e9)


def test_loop_iterations_drain_the_core_and_pay_the_barrier():
    trace = Trace(simulate.get_target("trn2"))
    trace.mark_iteration((0,))
    a = vector(trace, tile("dst", ident=10), tile("data", ident=11))
    trace.mark_iteration((0,))
    b = scalar(trace, tile("dst", ident=12), tile("data", ident=13))   # independent, yet waits
    est = estimate(trace)
    assert slot_of(est, a.index).start == pytest.approx(9e-6)
    assert slot_of(est, b.index).start == pytest.approx(slot_of(est, a.index).end + 9e-6)
    assert slot_of(est, b.index).reason == "loop barrier"
    assert est.schedule.barriers == {0: 2}
    assert est.lower_seconds == pytest.approx(18e-6 + compute_seconds(a, TRN2))
    assert estimate(trace, loop_iteration_s=4e-6).seconds == pytest.approx(est.seconds - 10e-6)
    assert est.schedule.critical_summary()["barrier / idle"] == pytest.approx(18e-6)
    assert est.serial_seconds == pytest.approx(18e-6 + compute_seconds(a, TRN2)
                                               + compute_seconds(b, TRN2))


def test_two_cores_are_scheduled_apart():
    trace = Trace(simulate.get_target("trn2"))
    a = vector(trace, tile("dst", ident=10), tile("data", ident=11), pid=(0,))
    b = vector(trace, tile("dst", ident=12), tile("data", ident=13), pid=(1,))
    est = estimate(trace)
    assert est.cores == 2 and slot_of(est, a.index).start == slot_of(est, b.index).start == 0
    one = estimate(trace, target="trn1")             # NeuronCore-v2: both instances on one core
    assert one.cores == 1 and one.seconds == pytest.approx(2 * compute_seconds(a, TRN1))


def test_device_loop_tiles_are_one_buffer_and_unrolled_tiles_are_not():
    from nki_kernels.simulate import nisa, nl

    @simulate.jit
    def kernel(x):
        out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)

        def body(i):
            t = nl.ndarray((1, 8), x.dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=t, src=x[0:1, :])
            nisa.dma_copy(dst=out[0:1, :], src=t)
        nl.fori_loop(0, 3, body)
        for _ in range(2):
            u = nl.ndarray((1, 8), x.dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=u, src=x[0:1, :])
        return out

    simulate.simulate(kernel)(np.ones((1, 8), np.float32))
    trace = simulate.last_trace()
    loads = [e.operands[0].storage for e in trace if e.operands[0].buffer == "sbuf"]
    assert len(set(loads[:3])) == 1 and len(set(loads[3:])) == 2 and loads[3] != loads[0]
    est = estimate(trace)
    assert est.schedule.barriers == {0: 3}
    # iteration i+1 reloads the tile iteration i stored from: it waits (the barrier, and data)
    dmas = [s for s in est.schedule.slots if s.lane == "dma"]
    assert dmas[2].start >= dmas[1].end


@pytest.mark.parametrize("target", ["trn1", "trn2"])
def test_bounds_hold_on_every_kernel(target):
    from nki_kernels.cli import check
    from nki_kernels.registry import KERNELS
    for name, spec in KERNELS.items():
        row = check(name, spec.demo, target, log=lambda *a: None)
        est = estimate(row["trace"], target=target)
        assert est.lower_seconds <= est.seconds * (1 + 1e-9), name
        assert est.seconds <= est.serial_seconds * (1 + 1e-9), name
        assert est.schedule.critical and est.schedule.slots[est.schedule.critical[-1]].end \
            == pytest.approx(est.seconds), name


def test_depends_on_edges_are_kept_and_checked():
    from nki_kernels.simulate import nisa, nl
    from nki_kernels.simulate.errors import ValidationError

    @simulate.jit
    def kernel(x):
        a = nl.ndarray((128, 64), nl.float32, buffer=nl.sbuf)
        b = nl.ndarray((128, 64), nl.float32, buffer=nl.sbuf)
        load = nisa.dma_copy(dst=a, src=x)
        # b does not read a: without the edge the memset could start at once
        ms = nisa.memset(dst=b, value=1.0)
        ms.depends_on(load, kind=nisa.dependency.runtime)
        return x

    simulate.simulate(kernel)(np.zeros((128, 64), np.float32))
    est = estimate(simulate.last_trace())
    load_slot = next(s for s in est.schedule.slots if s.lane == "dma")
    ms_slot = next(s for s in est.schedule.slots if s.op == "memset")
    assert ms_slot.start == pytest.approx(load_slot.end) and ms_slot.reason == "depends_on"

    @simulate.jit
    def leaves_a_loop(x):
        t = nl.ndarray((1, 8), nl.float32, buffer=nl.sbuf)
        inside = []
        nl.fori_loop(0, 2, lambda i: inside.append(nisa.memset(dst=t, value=0.0)))
        nisa.memset(dst=t, value=1.0).depends_on(inside[-1])
        return x

    with pytest.raises(ValidationError, match="cannot leave a dynamic loop"):
        simulate.simulate(leaves_a_loop)(np.zeros((1, 8), np.float32))

    @simulate.jit
    def backwards(x):
        t = nl.ndarray((1, 8), nl.float32, buffer=nl.sbuf)
        first = nisa.memset(dst=t, value=0.0)
        second = nisa.memset(dst=t, value=1.0)
        first.depends_on(second)
        return x

    with pytest.raises(ValidationError, match="issued after this instruction"):
        simulate.simulate(backwards)(np.zeros((1, 8), np.float32))


def test_a_vector_instruction_reading_the_one_just_before_pays_the_dependency():
    trace = Trace(simulate.get_target("trn2"))
    a = vector(trace, tile("dst", ident=10), tile("data", ident=11))
    b = vector(trace, tile("dst", ident=12), tile("data", ident=10))     # reads a's result
    c = vector(trace, tile("dst", ident=13), tile("data", ident=11))     # independent
    est = estimate(trace)
    t = compute_seconds(a, TRN2)
    assert slot_of(est, b.index).end - slot_of(est, b.index).start == pytest.approx(t + 100 / 0.96e9)
    assert slot_of(est, c.index).end - slot_of(est, c.index).start == pytest.approx(t)


def test_an_offset_table_is_free_once_the_descriptors_are_made():
    """Overwriting the indices of a gather waits for its descriptor generation, not the DMA."""
    trace = Trace(simulate.get_target("trn2"))
    index = Operand("src_offsets", "idx", "sbuf", "int32", (128, 1), ((1, 128), (1, 1)), 0, None,
                    50, 4)
    dst, src = tile("dst", ident=51), hbm("src", indirect="vector")
    g = trace.add(op="dma_copy", engine="dma", program_id=(0,), operands=(dst, src, index),
                  dma_bytes=dst.nbytes, dma_runs=128, hbm_read_bytes=dst.nbytes)
    index_write = Operand("dst", "idx", "sbuf", "int32", (128, 1), ((1, 128), (1, 1)), 0, None,
                          50, 4)
    w = vector(trace, index_write, tile("data", ident=52, free=1), free=1)
    est = estimate(trace)
    made = slot_of(est, g.index, "gpsimd")
    assert slot_of(est, w.index).start == pytest.approx(made.end)
    assert slot_of(est, w.index).start < slot_of(est, g.index, "dma").end
