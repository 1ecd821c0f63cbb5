"""The instruction trace: one ``Event`` per executed ISA instruction, for the cost model.

Each event records the engine, the program id, every operand's buffer/dtype/shape/pattern and the
bytes a DMA moved, with the contiguous runs (descriptor-sized pieces) it moved them in.
"""

from __future__ import annotations

import bisect
import threading
from collections import Counter
from dataclasses import dataclass, field
from typing import Optional, Tuple


@dataclass(frozen=True)
class Operand:
    """One operand of an instruction as the hardware sees it."""

    role: str                     # parameter name: "dst", "src", "data", "stationary", ...
    tensor: str                   # tensor name (allocation name, or "" when unnamed)
    buffer: str                   # "sbuf" | "psum" | "private_hbm" | "shared_hbm"
    dtype: str
    shape: Tuple[int, ...]
    pattern: Optional[Tuple[Tuple[int, int], ...]] = None   # ((step, num), ...) in elements
    offset: int = 0
    indirect: Optional[str] = None                         # None | "scalar" | "vector"
    storage: int = 0              # identity of the physical buffer (``Storage.ident``)
    row_bytes: int = 0            # bytes per partition of that buffer (on chip)
    address: Optional[Tuple[int, int]] = None              # (partition, byte) of a placed tensor

    @property
    def itemsize(self) -> int:
        from . import dtypes
        return dtypes.as_dtype(self.dtype).itemsize

    @property
    def nbytes(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n * self.itemsize


@dataclass
class Event:
    """One executed instruction."""

    index: int
    op: str                        # "dma_copy", "nc_matmul", ...
    engine: str                    # "dma" | "tensor" | "vector" | "scalar" | "gpsimd"
    program_id: Tuple[int, ...]
    operands: Tuple[Operand, ...]
    partitions: int = 0            # compute ops: partitions processed
    free_elems: int = 0            # compute ops: elements per partition processed
    dma_bytes: int = 0             # DMA: bytes written to dst (rows skipped by oob_mode.skip excluded)
    dma_runs: int = 0              # DMA: number of contiguous runs moved (descriptor count model)
    flops: int = 0                 # TensorE: 2*K*M*N
    hbm_read_bytes: int = 0        # DMA: bytes read from HBM (src in HBM)
    hbm_write_bytes: int = 0       # DMA: bytes written to HBM (dst in HBM)
    details: dict = field(default_factory=dict)
    name: Optional[str] = None     # the instruction's ``name=`` label
    loop_depth: int = 0            # device loops (fori_loop, while_loop, dynamic_range) around it
    first_pass: bool = True        # in the first iteration of every enclosing device loop: the
                                   # compiled program holds one copy of a loop body


class Trace:
    """Events of one or more kernel launches, in program order."""

    def __init__(self, target=None):
        self.target = target
        self.events = []
        self.memory_peaks = {}     # {"sbuf_bytes_per_partition": int, "psum_banks": int}
        self.loops = []            # device loops run: {"kind", "iterations", "location"}
        self.iteration_starts = []  # (index of the next event, program id) per device-loop
                                   # iteration begun: where the cost model puts its barrier
        self._lock = threading.Lock()    # LNC=2 instances record concurrently
        self.compiled = None       # after a launch: True if its compile key was new

    def add(self, **fields) -> Event:
        with self._lock:
            event = Event(index=len(self.events), **fields)
            self.events.append(event)
        return event

    def mark_iteration(self, program_id) -> None:
        with self._lock:
            self.iteration_starts.append((len(self.events), program_id))

    def canonicalise(self) -> None:
        """Put the events of concurrently run program instances (LNC=2) in an order that does not
        depend on thread timing: each program's own order kept, programs taken in id order
        within each *epoch* (the stretch between two of its synchronising instructions, events
        with ``details["sync"]``; the synchronising events end their epoch). The indices, the
        device-loop marks and the ``depends_on`` edges are renumbered to match."""
        epochs, keyed = {}, []
        for e in self.events:
            epoch = epochs.get(e.program_id, 0)
            keyed.append(((epoch, e.program_id, e.index), e))
            if (e.details or {}).get("sync") is not None:
                epochs[e.program_id] = epoch + 1
        keyed.sort(key=lambda k: k[0])
        old_by_program = {}            # program -> its events' old indices, ascending
        for e in self.events:
            old_by_program.setdefault(e.program_id, []).append(e.index)
        renumber = {e.index: new for new, (_, e) in enumerate(keyed)}
        for new, (_, e) in enumerate(keyed):
            e.index = new
            if e.details and "after" in e.details:
                e.details["after"] = [(renumber[p], kind) for p, kind in e.details["after"]]
        self.events = [e for _, e in keyed]

        def moved(at, pid):     # a mark made before old event `at`: before pid's next event
            olds = old_by_program.get(pid, [])
            i = bisect.bisect_left(olds, at)
            return renumber[olds[i]] if i < len(olds) else len(self.events)

        self.iteration_starts = sorted(((moved(at, pid), pid) for at, pid in self.iteration_starts),
                                       key=lambda m: m[0])

    def __len__(self):
        return len(self.events)

    def __iter__(self):
        return iter(self.events)

    def count_by_engine(self) -> Counter:
        return Counter(e.engine for e in self.events)

    def count_by_op(self) -> Counter:
        return Counter(e.op for e in self.events)

    @property
    def dma_bytes(self) -> int:
        return sum(e.dma_bytes for e in self.events)

    @property
    def hbm_bytes(self) -> int:
        """HBM traffic: bytes DMAs read from plus wrote to HBM."""
        return sum(e.hbm_read_bytes + e.hbm_write_bytes for e in self.events)

    @property
    def program_instructions(self) -> int:
        """Instructions in the compiled program of one core: those outside device loops plus one
        copy of each loop body (its first iteration); the largest over the program instances.
        Executed instructions are ``len(trace)``. A loop that ran zero times adds nothing here
        (its body was never traced), so this is a lower bound when some loop did not run."""
        per_core = Counter(e.program_id for e in self.events if e.first_pass)
        return max(per_core.values(), default=0)

    def summary(self) -> str:
        ops = ", ".join(f"{op} x{n}" for op, n in sorted(self.count_by_op().items()))
        return f"{len(self.events)} instructions ({ops}); DMA {self.dma_bytes} bytes"
