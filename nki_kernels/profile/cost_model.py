"""Estimate a kernel's time from the simulator's instruction trace.

Per instruction (``instruction_seconds``):
- DMA: bytes / (engines used x per-engine bandwidth x run efficiency) where engines used =
  ceil(rows / 8) capped at 16 and a contiguous run of b bytes moves at efficiency
  b / (b + dma_descriptor_bytes), and never faster than its HBM reads plus writes at HBM bandwidth
  (an HBM-to-HBM copy moves its bytes twice); plus the fixed overhead, of which ``dma_queues_in_flight`` DMAs
  overlap (counted as dma_fixed_s / dma_queues_in_flight per DMA).
- TensorE matmul: matmul_init + max(min(64, M), N) cycles (x4 with fp32 inputs); transpose
  max(P, min(64, F)).
- VectorE: static overhead + max(MIN_II, N) for one-input ops, 2N for tensor_tensor, 8N reciprocal.
- ScalarE: static overhead + max(MIN_II, N) (+ MIN_II when it also reduces).
- GpSimd: start-up + N.
Engines run concurrently and each runs its instructions in program order; dependencies between
engines are not modelled, so the estimate (busiest engine) is a lower bound on a well-pipelined
kernel, and the sum over engines an upper bound on a fully serialised one.

Two cores: the program instances of an LNC=2 launch (NeuronCore-v3+) run on two physical cores,
each with its own engines and its share of HBM bandwidth; the estimate is the busier core and the
HBM floor divides the bytes over the cores used. Instances on an older target share one core.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Dict, List, Tuple

from .constants import Hardware, hardware

HBM = ("private_hbm", "shared_hbm")


def _dma_seconds(e, hw: Hardware) -> float:
    if e.dma_bytes == 0:
        return hw.dma_fixed_s / hw.dma_queues_in_flight
    rows = max(1, e.operands[0].shape[0] if e.operands[0].buffer not in HBM else e.operands[1].shape[0])
    engines = min(hw.dma_engines, math.ceil(rows / hw.partitions_per_dma_engine))
    run = e.dma_bytes / max(1, e.dma_runs)
    efficiency = run / (run + hw.dma_descriptor_bytes)
    rate = engines * hw.dma_bytes_per_s / hw.dma_engines * efficiency
    # an HBM-to-HBM copy reads and writes HBM: never faster than that traffic at HBM bandwidth
    hbm_s = (e.hbm_read_bytes + e.hbm_write_bytes) / hw.hbm_bytes_per_s
    return max(e.dma_bytes / rate, hbm_s) + hw.dma_fixed_s / hw.dma_queues_in_flight


def _cycles(e, hw: Hardware) -> Tuple[float, float]:
    """(cycles, clock) of a compute instruction."""
    n = max(1, e.free_elems)
    if e.engine == "tensor":
        if e.op == "nc_matmul":
            m = e.details.get("M", 1)
            factor = hw.fp32_matmul_factor if e.operands[2].dtype == "float32" else 1
            return hw.matmul_init_cycles + max(min(64, m), n) * factor, hw.tensor_hz
        return max(e.partitions, min(64, n)), hw.tensor_hz
    if e.engine == "gpsimd":
        return hw.gpsimd_start_cycles + n, hw.gpsimd_hz
    if e.engine == "scalar":
        extra = hw.min_ii_cycles if e.details.get("reduce") else 0
        return hw.static_overhead_cycles + max(hw.min_ii_cycles, n) + extra, hw.scalar_hz
    work = {"tensor_tensor": 2 * n, "reciprocal": hw.reciprocal_factor * n}.get(e.op, n)
    return hw.static_overhead_cycles + max(hw.min_ii_cycles, work), hw.vector_hz


def instruction_seconds(e, hw: Hardware) -> float:
    if e.engine == "dma":
        return _dma_seconds(e, hw)
    cycles, clock = _cycles(e, hw)
    return cycles / clock


@dataclass
class Estimate:
    """Modelled cost of one trace."""

    hw: Hardware
    engine_seconds: Dict[str, float]
    instructions: Dict[str, int]
    hbm_bytes: int
    dma_count: int
    dma_runs: int
    flops: int
    timeline: List[Tuple[str, str, float, float]] = field(default_factory=list)  # engine, op, start, dur
    core_engine_seconds: Dict[Tuple[int, str], float] = field(default_factory=dict)

    @property
    def cores(self) -> int:
        return max(1, len({c for c, _ in self.core_engine_seconds}))

    def core_seconds(self, core: int) -> float:
        """One core's busiest engine."""
        return max((t for (c, _), t in self.core_engine_seconds.items() if c == core), default=0.0)

    @property
    def seconds(self) -> float:
        """Engines overlapped: the busiest engine of the busier core."""
        return max((self.core_seconds(c) for c in range(self.cores)), default=0.0)

    @property
    def serial_seconds(self) -> float:
        """Every engine of a core one after another; the slower core."""
        per = {}
        for (c, _), t in self.core_engine_seconds.items():
            per[c] = per.get(c, 0.0) + t
        return max(per.values(), default=0.0)

    @property
    def hbm_floor_seconds(self) -> float:
        return self.hbm_bytes / (self.hw.hbm_bytes_per_s * self.cores)

    def flop_floor_seconds(self, fp32=False) -> float:
        peak = self.hw.tensor_peak_fp32 if fp32 else self.hw.tensor_peak_bf16
        return self.flops / (peak * self.cores)


def estimate(trace, target: str = None, hw: Hardware = None, **overrides) -> Estimate:
    """Cost of ``trace`` (a simulate.Trace) on ``target`` (default: the trace's own)."""
    hw = hw or hardware(target or trace.target.name, **overrides)
    two_cores = trace.target is None or trace.target.nc_version >= 3
    pids = sorted({e.program_id for e in trace})
    core_of = {p: (i if two_cores else 0) for i, p in enumerate(pids)}
    one_core = len(set(core_of.values())) <= 1
    busy: Dict[Tuple[int, str], float] = {}
    counts: Dict[str, int] = {}
    timeline = []
    for e in trace:
        dur = instruction_seconds(e, hw)
        key = (core_of[e.program_id], e.engine)
        start = busy.get(key, 0.0)
        busy[key] = start + dur
        counts[e.engine] = counts.get(e.engine, 0) + 1
        lane = e.engine if one_core else f"core{key[0]} {e.engine}"
        timeline.append((lane, e.name or e.op, start, dur))
    per_engine: Dict[str, float] = {}
    for (_, engine), t in busy.items():
        per_engine[engine] = max(per_engine.get(engine, 0.0), t)
    dmas = [e for e in trace if e.engine == "dma"]
    return Estimate(hw, per_engine, counts, trace.hbm_bytes, len(dmas),
                    sum(e.dma_runs for e in dmas), sum(e.flops for e in trace), timeline, busy)
