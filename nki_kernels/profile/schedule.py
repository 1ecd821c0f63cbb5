"""Replay a trace as the hardware runs it: engines in order, dependencies through memory.

Rules (per physical core; the cores of an LNC=2 launch share nothing but HBM, and order each
other only at their synchronising instructions):
- Each compute engine (tensor, vector, scalar, gpsimd) runs its instructions in program order,
  one at a time; a VectorE (ScalarE) instruction that reads the result of the one just before
  it pays ``dependent_vector_cycles`` (``dependent_scalar_cycles``) more.
- An instruction starts when its engine is free and every earlier instruction it depends on has
  ended: it reads memory an earlier one wrote (read after write), or writes memory an earlier
  one read or wrote (write after read / write). Memory is tracked as boxes of partitions x
  bytes per physical buffer (``footprint``); a device-loop body's n-th tile is one buffer in
  every iteration, as on the device.
- A DMA first needs descriptors: none for a static pattern (built before the launch), GpSimd
  time for software DGE (indirect, or dynamic on NeuronCore-v2), one of the hardware DGE units
  for ``hwdge`` (dynamic on v3+; also occupying ScalarE when ``engine=scalar`` triggers it).
  Descriptor generation reads the DMA's offset tables (``<role>_offsets`` operands), so they
  may be overwritten once it is done. The DMA then takes one of ``dma_queues_in_flight``
  slots, waits the fixed semaphore-to-start latency, and moves its bytes on ``ceil(rows / 8)``
  of the 16 DMA engines, at the first time that many are idle for the whole transfer (a DMA
  triggered later may use engines idle before one triggered earlier: an engine is held only
  while it moves data). DMAs are ordered only by their data and by these resources.
- An explicit ``depends_on`` edge holds an instruction until its producer ends (``runtime``,
  the default) or starts (``schedule``: issue order only).
- The two cores' memory dependencies are not tracked against each other (no semaphore joins
  them): a ``sendrecv`` starts on both cores when both sources are ready, a ``core_barrier``
  when both cores have drained, and nothing of a core starts before its barrier ends. The
  trace comes in the simulator's canonical order (``Trace.canonicalise``), so the schedule
  does not depend on how its threads interleaved.
- Each iteration of a device loop (``fori_loop``, ``while_loop``, ``dynamic_range``) starts
  with a barrier: every engine of the core drains, then ``loop_iteration_s`` passes.

The result is the makespan, the instructions' start and end times, each engine's utilisation
and the critical path: from the last instruction to end, back through whatever each one waited
for (its engine, the data it needed, a DMA resource, a loop barrier).
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

from .constants import Hardware
from .footprint import WRITTEN, covers, footprint, overlaps

HISTORY = 48          # boxes remembered per buffer and kind before merging them (conservative)


@dataclass
class Slot:
    """One scheduled piece of work: an instruction, or the descriptor generation of a DMA."""

    index: int                  # the trace event
    core: int
    lane: str                   # "tensor" ... "gpsimd", "dma", "dge"
    op: str
    start: float
    end: float
    waited_for: Optional[int]   # slot (position in Schedule.slots) whose end set the start
    reason: str                 # "start" | "engine" | "data" | "dma queue" | "dma engines" |
                                # "descriptors" | "loop barrier" | "depends_on"
    work: float = 0.0           # its own cost, waits excluded: compute time, descriptor
                                # generation, or a DMA's data movement
    fixed: float = 0.0          # DMA: the semaphore-to-start latency inside [start, end)
    engines: int = 0            # DMA: engines used


@dataclass
class Schedule:
    slots: List[Slot]
    makespan: float
    barriers: Dict[int, int]                       # core -> loop-iteration barriers
    cores: int
    critical: List[int] = field(default_factory=list)  # slot positions, first to last

    def busy(self, core: int, lane: str) -> float:
        """Seconds ``lane`` of ``core`` is occupied (DMA: the queues' union, engines ignored)."""
        spans = sorted((s.start, s.end) for s in self.slots if s.core == core and s.lane == lane)
        total, reach = 0.0, -math.inf
        for a, b in spans:
            if b > reach:
                total += b - max(a, reach)
                reach = b
        return total

    def utilisation(self) -> Dict[Tuple[int, str], float]:
        """Fraction of the makespan each (core, lane) is busy."""
        lanes = {(s.core, s.lane) for s in self.slots}
        if not self.makespan:
            return {k: 0.0 for k in lanes}
        return {k: self.busy(*k) / self.makespan for k in sorted(lanes)}

    def critical_summary(self) -> Dict[str, float]:
        """Seconds of the critical path spent per lane, plus waiting ("barrier", "dma latency")."""
        out: Dict[str, float] = {}
        for k in self.critical:
            s = self.slots[k]
            busy = s.end - s.start - s.fixed
            out[s.lane] = out.get(s.lane, 0.0) + busy
            if s.fixed:
                out["dma latency"] = out.get("dma latency", 0.0) + s.fixed
        gaps = self.makespan - sum(out.values())
        if gaps > 1e-15:
            out["barrier / idle"] = gaps
        return out


class _Memory:
    """Per physical buffer: the boxes last written and read since, with when they end."""

    def __init__(self):
        self.writes: Dict[int, list] = {}
        self.reads: Dict[int, list] = {}

    def ready(self, box, write: bool, best):
        for entry in self.writes.get(box[0], ()):
            if entry[2] > best[0] and overlaps(entry[0], box):
                best = (entry[2], entry[1], "data")
        if write:
            for entry in self.reads.get(box[0], ()):
                if entry[2] > best[0] and overlaps(entry[0], box):
                    best = (entry[2], entry[1], "data")
        return best

    def record(self, box, write: bool, slot: int, end: float):
        key = box[0]
        if write:
            for table in (self.writes, self.reads):
                kept = [e for e in table.get(key, ()) if not covers(box, e[0])]
                table[key] = kept
        table = self.writes if write else self.reads
        entries = table.setdefault(key, [])
        entries.append((box, slot, end))
        if len(entries) > HISTORY:                 # merge into one box that ends last
            last = max(entries, key=lambda e: e[2])
            merged = (key, min(e[0][1] for e in entries), max(e[0][2] for e in entries),
                      min(e[0][3] for e in entries), max(e[0][4] for e in entries))
            table[key] = [(merged, last[1], last[2])]


def dge_mode(e, hw: Hardware, nc_version: int) -> str:
    """How a DMA's descriptors are made: "none", "swdge" or "hwdge"."""
    mode = (e.details or {}).get("dge_mode", "unknown")
    if mode in ("none", "swdge", "hwdge"):
        return mode
    kinds = {o.indirect for o in e.operands}
    if "vector" in kinds:
        return "swdge"
    if "scalar" in kinds:
        return "hwdge" if nc_version >= 3 and hw.hwdge_units else "swdge"
    return "none"


def dma_engines_used(e, hw: Hardware) -> int:
    on_chip = [o for o in e.operands[:2] if o.buffer in ("sbuf", "psum")]
    rows = (on_chip[0] if on_chip else e.operands[0]).shape[0] if e.operands else 1
    return max(1, min(hw.dma_engines, math.ceil(max(1, rows) / hw.partitions_per_dma_engine)))


def dma_transfer_seconds(e, hw: Hardware) -> float:
    """Moving a DMA's bytes once it has started: its engines at the efficiency of its run
    length, never faster than its HBM reads plus writes at HBM bandwidth."""
    if e.dma_bytes == 0:
        return 0.0
    run = e.dma_bytes / max(1, e.dma_runs)
    efficiency = run / (run + hw.dma_descriptor_bytes)
    rate = dma_engines_used(e, hw) * hw.dma_bytes_per_s / hw.dma_engines * efficiency
    hbm_s = (e.hbm_read_bytes + e.hbm_write_bytes) / hw.hbm_bytes_per_s
    return max(e.dma_bytes / rate, hbm_s)


def descriptor_seconds(e, hw: Hardware, mode: str) -> float:
    """GpSimd (software DGE) or DGE-unit (hardware DGE) time before a DMA can start. A software-
    DGE DMA triggers in ``swdge_fixed_cycles`` (the DMA overview's profile); an indirect one
    (``vector_offset``) also makes a descriptor per row from its offsets."""
    if mode == "swdge":
        rows = max(1, e.dma_runs) if any(o.indirect == "vector" for o in e.operands) else 0
        return (hw.swdge_fixed_cycles + hw.swdge_cycles_per_descriptor * rows) / hw.gpsimd_hz
    if mode == "hwdge":
        return hw.hwdge_instruction_s
    return 0.0


def schedule(trace, hw: Hardware, core_of: Dict[tuple, int], compute_seconds,
             nc_version: int) -> Schedule:
    """Schedule ``trace``; ``compute_seconds(event)`` prices a compute instruction."""
    return _Scheduler(trace, hw, core_of, compute_seconds, nc_version).run()


class _Scheduler:
    """The state of one scheduling pass: per core the engines' and lanes' free times, the DMA
    queues, engines and hardware-DGE units, the last slot, the floor a loop barrier or core
    barrier sets, the memory boxes; and the slots placed so far."""

    def __init__(self, trace, hw: Hardware, core_of, compute_seconds, nc_version: int):
        self.trace, self.hw, self.core_of = trace, hw, core_of
        self.compute_seconds, self.nc_version = compute_seconds, nc_version
        self.slots: List[Slot] = []
        self.free: Dict[Tuple[int, str], Tuple[float, Optional[int]]] = {}
        self.queues: Dict[int, list] = {}
        self.engines: Dict[int, list] = {}
        self.dge: Dict[int, list] = {}
        self.last_end: Dict[int, Tuple[float, Optional[int]]] = {}
        self.floor: Dict[int, Tuple[float, Optional[int], str]] = {}
        self.barriers: Dict[int, int] = {}
        self.memories: Dict[int, _Memory] = {}    # per core: cores order each other at syncs
        self.slot_of: Dict[int, int] = {}          # trace event -> its (main) slot

    def run(self) -> Schedule:
        trace, core_of = self.trace, self.core_of
        marks = sorted(trace.iteration_starts, key=lambda m: m[0])
        next_mark = 0
        held: Dict[tuple, list] = {}          # sync key -> (event, core, boxes) of the cores there
        cores_in_trace = len({core_of[e.program_id] for e in trace})
        for e in trace:
            while next_mark < len(marks) and marks[next_mark][0] <= e.index:
                self.barrier(core_of[marks[next_mark][1]])
                next_mark += 1
            core = core_of[e.program_id]
            boxes = [(footprint(o), o.role in WRITTEN) for o in e.operands]
            sync = (e.details or {}).get("sync")
            if sync is not None and cores_in_trace > 1:
                group = held.setdefault(sync, [])
                group.append((e, core, boxes))
                if len(group) == cores_in_trace:
                    self.place_together(held.pop(sync))
                continue
            self.place(e, core, self.ready_of(e, core, boxes), boxes)
        for group in held.values():           # a partner that never came (the launch failed)
            self.place_together(group)
        while next_mark < len(marks):
            self.barrier(core_of[marks[next_mark][1]])
            next_mark += 1
        makespan = max([s.end for s in self.slots] + [f[0] for f in self.floor.values()],
                       default=0.0)
        result = Schedule(self.slots, makespan, self.barriers,
                          max(1, len(set(core_of.values()))))
        result.critical = _critical_path(self.slots, self.floor, makespan)
        return result

    def barrier(self, core):
        end, slot = self.last_end.get(core, (0.0, None))
        self.floor[core] = (end + self.hw.loop_iteration_s, slot, "loop barrier")
        self.barriers[core] = self.barriers.get(core, 0) + 1

    def add(self, slot: Slot) -> int:
        self.slots.append(slot)
        k = len(self.slots) - 1
        if slot.end >= self.last_end.get(slot.core, (-1.0, None))[0]:
            self.last_end[slot.core] = (slot.end, k)
        return k

    def memory_of(self, core) -> _Memory:
        memory = self.memories.get(core)
        if memory is None:
            memory = self.memories[core] = _Memory()
        return memory

    def ready_of(self, e, core, boxes):
        """When ``e`` may start as far as its data (``boxes``: its operands' footprints and
        whether each is written), ``depends_on`` edges and loop barriers go."""
        ready = self.floor.get(core, (0.0, None, "start"))
        memory = self.memory_of(core)
        for box, write in boxes:
            ready = memory.ready(box, write, ready)
        for producer, kind in (e.details or {}).get("after", ()):   # NkiInstruction.depends_on
            k = self.slot_of.get(producer)
            if k is not None:
                t = self.slots[k].end if kind == "runtime" else self.slots[k].start
                ready = _later(ready, (t, k, "depends_on"))
        return ready

    def place(self, e, core, ready, boxes):
        """Place ``e`` (a DMA with its descriptors, or a compute instruction) and record the
        memory it reads and writes."""
        made = None                       # when a DMA's descriptors (and offsets) are done
        if e.engine == "dma":
            made = self.place_descriptors(e, core, ready)
            k = self.place_transfer(e, core, made or ready)
        else:
            k = self.place_compute(e, core, ready)
        self.slot_of[e.index] = k
        memory = self.memory_of(core)
        for (box, write), o in zip(boxes, e.operands):
            if made is not None and o.role.endswith("_offsets"):
                memory.record(box, write, made[1], made[0])     # read by descriptor generation
            else:
                memory.record(box, write, k, self.slots[k].end)

    def place_descriptors(self, e, core, ready):
        """A DMA's descriptor generation (software DGE on GpSimd, or a hardware DGE unit);
        returns when the descriptors are made, or None when the DMA needs none."""
        hw = self.hw
        mode = dge_mode(e, hw, self.nc_version)
        if mode == "none":
            return None
        cost = descriptor_seconds(e, hw, mode)
        unit = None                 # hardware DGE: the unit free first
        if mode == "swdge":
            lane = (core, "gpsimd")
        else:
            units = self.dge.setdefault(core, [(0.0, None)] * max(1, hw.hwdge_units))
            unit = _earliest(units)
            trigger = str((e.details or {}).get("queue_engine") or "")
            lane = (core, "scalar") if "scalar" in trigger else None
        start = ready
        if lane is not None:
            start = _later(start, (*self.free.get(lane, (0.0, None)), "engine"))
        if unit is not None:
            start = _later(start, (*self.dge[core][unit], "descriptors"))
        k = self.add(Slot(e.index, core, "gpsimd" if mode == "swdge" else "dge",
                          f"{e.op} descriptors", start[0], start[0] + cost, start[1],
                          start[2], work=cost))
        made = (start[0] + cost, k, "descriptors")
        if lane is not None:
            self.free[lane] = made[:2]
        if unit is not None:
            self.dge[core][unit] = made[:2]
        return made

    def place_transfer(self, e, core, ready) -> int:
        """A DMA's transfer: a queue in flight, then its engines after the fixed latency, at
        the first time ``ceil(rows / 8)`` engines are all idle for the whole transfer (a DMA
        triggered later in program order may use engines idle before one triggered earlier:
        no DMA holds an engine before it is triggered)."""
        hw = self.hw
        q = self.queues.setdefault(core, [(0.0, None)] * hw.dma_queues_in_flight)
        qi = _earliest(q)
        start = _later(ready, (*q[qi], "dma queue"))
        used = dma_engines_used(e, hw)
        pool = self.engines.setdefault(core, [_EngineTimeline() for _ in range(hw.dma_engines)])
        transfer = dma_transfer_seconds(e, hw)
        move, chosen, blocker = _engine_window(pool, start[0] + hw.dma_fixed_s, transfer, used)
        waited = start if blocker is None else (move, blocker, "dma engines")
        end = move + transfer
        k = self.add(Slot(e.index, core, "dma", e.name or e.op, start[0], end, waited[1],
                          waited[2], work=transfer, fixed=hw.dma_fixed_s, engines=used))
        q[qi] = (end, k)
        for i in chosen:
            pool[i].book(move, end, k)
        return k

    def place_compute(self, e, core, ready) -> int:
        """A compute instruction on its engine, in program order; a VectorE or ScalarE
        instruction that reads the result of the one just before it pays the dependency
        latency."""
        lane = (core, e.engine)
        previous = self.free.get(lane, (0.0, None))
        start = _later(ready, (*previous, "engine"))
        cost = self.compute_seconds(e)
        end = start[0] + cost
        if (e.engine in ("vector", "scalar") and previous[1] is not None
                and ready[1] == previous[1] and ready[2] == "data"):   # reads the one just before
            end += (self.hw.dependent_vector_cycles / self.hw.vector_hz if e.engine == "vector"
                    else self.hw.dependent_scalar_cycles / self.hw.scalar_hz)
        k = self.add(Slot(e.index, core, e.engine, e.name or e.op, start[0], end, start[1],
                          start[2], work=cost))
        self.free[lane] = (end, k)
        return k

    def place_together(self, group):
        """The cores' halves of one synchronising instruction start together, when the last of
        them could start alone: a ``sendrecv`` when both sources are ready, a ``core_barrier``
        when both cores have drained. Nothing after a barrier starts before it ends."""
        readies = []
        for e, core, boxes in group:
            ready = self.ready_of(e, core, boxes)
            if e.engine != "dma":
                ready = _later(ready, (*self.free.get((core, e.engine), (0.0, None)), "engine"))
            if e.op == "core_barrier":
                ready = _later(ready, (*self.last_end.get(core, (0.0, None)), "drain"))
            readies.append(ready)
        joint = max(readies, key=lambda r: r[0])
        for (e, core, boxes), ready in zip(group, readies):
            self.place(e, core, _later(ready, (joint[0], joint[1], "other core")), boxes)
            if e.op == "core_barrier":
                end = self.slots[self.slot_of[e.index]]
                self.floor[core] = _later(self.floor.get(core, (0.0, None, "start")),
                                          (end.end, self.slot_of[e.index], "core barrier"))


class _EngineTimeline:
    """One DMA engine's booked transfers (start, end, slot), sorted by start; beyond HISTORY
    of them the oldest merge into ``floor``, before which the engine is taken as busy."""

    def __init__(self):
        self.busy: List[Tuple[float, float, int]] = []
        self.floor: Tuple[float, Optional[int]] = (0.0, None)

    def idle_from(self, t: float, duration: float):
        """(t, None) when the engine is idle over [t, t + duration), else (the end of the
        transfer in the way, its slot)."""
        if t < self.floor[0]:
            return self.floor
        for b0, b1, k in self.busy:
            if b0 < t + duration and t < b1:
                return b1, k
        return t, None

    def book(self, start: float, end: float, slot: int):
        bisect.insort(self.busy, (start, end, slot))
        if len(self.busy) > HISTORY:
            old = self.busy.pop(0)
            if old[1] > self.floor[0]:
                self.floor = (old[1], old[2])


def _engine_window(pool, earliest: float, duration: float, used: int):
    """(start, engines, slot that delayed it or None): the first time from ``earliest`` at
    which ``used`` engines of ``pool`` are idle for ``duration``; the candidates are
    ``earliest`` and the ends of the transfers in the way."""
    t, blocker = earliest, None
    while True:
        free, later = [], []
        for i, engine in enumerate(pool):
            at, k = engine.idle_from(t, duration)
            if k is None:
                free.append(i)
            else:
                later.append((at, k))
        if len(free) >= used:
            return t, free[:used], blocker
        t, blocker = min(later)


def _later(a, b):
    """The later of two (time, slot, reason) readiness marks (the first on a tie)."""
    return b if b[0] > a[0] else a


def _earliest(pool) -> int:
    """Position of the (end, slot) pair in ``pool`` that frees first."""
    return min(range(len(pool)), key=lambda i: pool[i][0])


def _critical_path(slots: List[Slot], floor, makespan: float) -> List[int]:
    ends = [(s.end, k) for k, s in enumerate(slots)]
    if not ends:
        return []
    end, k = max(ends)
    for t, slot, _ in floor.values():           # a trailing barrier sets the makespan
        if t >= makespan and slot is not None and t > end:
            k = slot
    path = []
    while k is not None:
        path.append(k)
        k = slots[k].waited_for
    return path[::-1]
