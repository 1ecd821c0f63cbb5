"""Estimate a kernel's time from the simulator's instruction trace.

Per instruction (``instruction_seconds``):
- DMA: bytes / (engines used x per-engine bandwidth x run efficiency) where engines used =
  ceil(rows / 8) capped at 16 and a contiguous run of b bytes moves at efficiency
  b / (b + dma_descriptor_bytes), and never faster than its HBM reads plus writes at HBM
  bandwidth (an HBM-to-HBM copy moves its bytes twice); plus a fixed semaphore-to-start latency
  and, for dynamic or indirect DMAs, descriptor generation (``schedule``).
- TensorE matmul: its initiation interval max(MM_INIT_LATENCY, min(64, M), N) cycles (x4 with
  fp32 inputs): the ISA's max(min(64, N_stationary), N_moving), floored at the 64-cycle
  turnaround the architecture guide gives back-to-back MultiplyMoving instructions (TensorE is
  pipelined: the init latency overlaps the previous instruction, it is not added to it);
  transpose max(P, min(64, F)).
- VectorE: static overhead + max(MIN_II, N) for one-input ops, 2N for tensor_tensor, 8N reciprocal.
- ScalarE: static overhead + max(MIN_II, N) (+ MIN_II when it also reduces).
- GpSimd: start-up + N.

Three figures per trace, all reported:
- ``seconds``: the makespan of the dependency-aware schedule (``schedule.py``): the estimate.
- ``lower_seconds``: the busiest resource's total work (each engine; the 16 DMA engines and the
  DMA queues as pools), plus the loop barriers: no schedule can beat it.
- ``serial_seconds``: every instruction and every DMA latency one after another.

Two cores: the program instances of an LNC=2 launch (NeuronCore-v3+) run on two physical cores,
each with its own engines and its share of HBM bandwidth; the HBM floor divides the bytes over
the cores used. Instances on an older target share one core.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Tuple

from .constants import Hardware, hardware
from .schedule import Schedule, dma_transfer_seconds, schedule


def _cycles(e, hw: Hardware) -> Tuple[float, float]:
    """(cycles, clock) of a compute instruction."""
    n = max(1, e.free_elems)
    if e.engine == "tensor":
        if e.op == "nc_matmul":
            m = e.details.get("M", 1)
            factor = hw.fp32_matmul_factor if e.operands[2].dtype == "float32" else 1
            return max(hw.matmul_init_cycles, min(64, m), n) * factor, hw.tensor_hz
        return max(e.partitions, min(64, n)), hw.tensor_hz
    if e.engine == "gpsimd":
        return hw.gpsimd_start_cycles + n, hw.gpsimd_hz
    if e.engine == "scalar":
        extra = hw.min_ii_cycles if e.details.get("reduce") else 0
        return hw.static_overhead_cycles + max(hw.min_ii_cycles, n) + extra, hw.scalar_hz
    # two tensor inputs stream twice the elements [ISA]; the scan reads two tensors too
    work = {"tensor_tensor": 2 * n, "tensor_tensor_scan": 2 * n,
            "reciprocal": hw.reciprocal_factor * n}.get(e.op, n)
    return hw.static_overhead_cycles + max(hw.min_ii_cycles, work), hw.vector_hz


def compute_seconds(e, hw: Hardware) -> float:
    cycles, clock = _cycles(e, hw)
    return cycles / clock


def instruction_seconds(e, hw: Hardware) -> float:
    """Time of one instruction on its engine; a DMA's fixed latency counted as the share of it
    that ``dma_queues_in_flight`` overlapping DMAs leave (the throughput view)."""
    if e.engine == "dma":
        return dma_transfer_seconds(e, hw) + hw.dma_fixed_s / hw.dma_queues_in_flight
    return compute_seconds(e, hw)


@dataclass
class Estimate:
    """Modelled cost of one trace."""

    hw: Hardware
    engine_seconds: Dict[str, float]          # busiest core's total per engine (throughput view)
    instructions: Dict[str, int]
    hbm_bytes: int
    dma_count: int
    dma_runs: int
    flops: int
    schedule: Schedule
    core_engine_seconds: Dict[Tuple[int, str], float] = field(default_factory=dict)
    core_serial_seconds: Dict[int, float] = field(default_factory=dict)

    @property
    def cores(self) -> int:
        return self.schedule.cores

    @property
    def seconds(self) -> float:
        """The scheduled estimate: the makespan (plus the launch overhead, 0 unless
        calibrated)."""
        return self.schedule.makespan + self.hw.launch_overhead_s

    def core_seconds(self, core: int) -> float:
        """When ``core``'s last instruction ends in the schedule."""
        return max((s.end for s in self.schedule.slots if s.core == core), default=0.0)

    @property
    def barrier_seconds(self) -> float:
        """Loop-iteration barriers of the core with most of them."""
        return max(self.schedule.barriers.values(), default=0) * self.hw.loop_iteration_s

    @property
    def lower_seconds(self) -> float:
        """Busiest resource of the busier core plus its loop barriers (perfect overlap)."""
        per_core: Dict[int, float] = {}
        for (c, _), t in self.core_engine_seconds.items():
            per_core[c] = max(per_core.get(c, 0.0), t)
        return max((t + self.schedule.barriers.get(c, 0) * self.hw.loop_iteration_s
                    for c, t in per_core.items()), default=0.0)

    @property
    def serial_seconds(self) -> float:
        """Everything of a core one after another (every DMA latency in full); the slower core."""
        return max(self.core_serial_seconds.values(), default=0.0)

    @property
    def timeline(self) -> List[Tuple[str, str, float, float]]:
        """(lane, op, start, duration) per scheduled slot; lanes prefixed by core when two."""
        two = self.cores > 1
        return [((f"core{s.core} {s.lane}" if two else s.lane), s.op, s.start, s.end - s.start)
                for s in self.schedule.slots]

    @property
    def hbm_floor_seconds(self) -> float:
        return self.hbm_bytes / (self.hw.hbm_bytes_per_s * self.cores)

    def flop_floor_seconds(self, fp32=False) -> float:
        peak = self.hw.tensor_peak_fp32 if fp32 else self.hw.tensor_peak_bf16
        return self.flops / (peak * self.cores)


def estimate(trace, target: str = None, hw: Hardware = None, **overrides) -> Estimate:
    """Cost of ``trace`` (a simulate.Trace) on ``target`` (default: the trace's own)."""
    hw = hw or hardware(target or trace.target.name, **overrides)
    nc_version = trace.target.nc_version if trace.target is not None else 3
    if target is not None:
        from nki_kernels.simulate.targets import get_target
        nc_version = get_target(target).nc_version
    two_cores = nc_version >= 3
    pids = sorted({e.program_id for e in trace} | {p for _, p in trace.iteration_starts})
    core_of = {p: (i if two_cores else 0) for i, p in enumerate(pids)}
    plan = schedule(trace, hw, core_of, lambda e: compute_seconds(e, hw), nc_version)
    work: Dict[Tuple[int, str], float] = {}
    serial: Dict[int, float] = {}
    for s in plan.slots:             # each slot's own cost, as the schedule priced it
        if s.lane == "dma":          # the 16 engines and the queues as pools
            pools = (("dma", s.work * s.engines / hw.dma_engines),
                     ("dma queues", (s.work + s.fixed) / hw.dma_queues_in_flight))
            alone = s.work + s.fixed
        elif s.lane == "dge":
            pools, alone = (("dge", s.work / max(1, hw.hwdge_units)),), s.work
        else:
            pools, alone = ((s.lane, s.work),), s.work
        for lane, t in pools:
            work[(s.core, lane)] = work.get((s.core, lane), 0.0) + t
        serial[s.core] = serial.get(s.core, 0.0) + alone
    for c, n in plan.barriers.items():
        serial[c] = serial.get(c, 0.0) + n * hw.loop_iteration_s
    per_engine: Dict[str, float] = {}
    for (_, lane), t in work.items():
        per_engine[lane] = max(per_engine.get(lane, 0.0), t)
    dmas = [e for e in trace if e.engine == "dma"]
    return Estimate(hw, per_engine, dict(trace.count_by_engine()), trace.hbm_bytes, len(dmas),
                    sum(e.dma_runs for e in dmas), sum(e.flops for e in trace), plan, work,
                    serial)
