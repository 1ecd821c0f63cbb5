"""What the simulator is doing now: target, program id, trace, memory; and error construction."""

from __future__ import annotations

import contextlib
import functools
import os
import sys
import threading
import weakref
from dataclasses import dataclass, field
from typing import Optional, Tuple

from .memory import note_use
from .targets import Target, get_target

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))


@dataclass
class Launch:
    """One kernel launch: shared by all its program instances."""

    target: Target
    grid: Tuple[int, ...] = ()
    trace: object = None          # simulate.trace.Trace
    memory: object = None         # simulate.memory.Memory of the running instance
    shared_hbm: list = field(default_factory=list)   # shared_hbm storages, by allocation order
    program_id: Tuple[int, ...] = (0,)
    shared_hbm_cursor: int = 0
    rank: int = 0                 # rank of this program in a multi-rank (collectives) job
    job: object = None            # simulate.lnc.Meeting of the job's ranks (None: one rank)
    precise_fp: bool = True       # False under NKI_PRECISE_FP=0 (read at launch)
    loop_frames: list = field(default_factory=list)  # LoopFrame per enclosing device loop
    while_loops: list = field(default_factory=list)  # open ``while reg:`` loops: (site, iterations)
    issued: int = 0               # instructions issued by this instance (depends_on order)
    is_default: bool = False      # the stand-in launch of code outside any kernel

    def loop_position(self) -> Tuple[int, bool]:
        """(device loops around the current point, whether every one is in its first iteration:
        the part of the run that the compiled program holds once)."""
        return len(self.loop_frames), not any(f.iteration for f in self.loop_frames)


class LoopFrame:
    """One device loop being run: its iteration number, and the allocations of its body. The compiled body allocates once and every iteration
    reuses the same buffers, so when a tile made by the n-th allocation of an iteration is still
    referenced as the next iteration makes its n-th allocation (it was kept across iterations),
    the two are one buffer here too, and the kept tile is overwritten as it would be on device.
    Tiles nobody keeps are freed as usual (weak references), so capacity is counted by liveness."""

    def __init__(self):
        self.storages, self.ordinal, self.iteration = [], 0, 0
        self.idents = []            # per ordinal: (ident, shape, dtype, buffer) of its buffer

    def next_iteration(self, iteration: int):
        self.iteration, self.ordinal = iteration, 0

    def take(self, shape, dtype, buffer):
        """The live storage this allocation aliases, or None (allocate, then ``keep``)."""
        if self.ordinal < len(self.storages):
            s = self.storages[self.ordinal]()
            if s is not None and s.shape == tuple(shape) and s.dtype == dtype and s.buffer == buffer:
                self.ordinal += 1
                return s
        return None

    def keep(self, storage):
        """Remember ``storage`` as this ordinal's buffer; a fresh allocation where an earlier
        iteration's (since freed) buffer of the same kind stood takes that buffer's identity."""
        kind = (storage.shape, storage.dtype, storage.buffer)
        if self.ordinal < len(self.idents):
            ident, *was = self.idents[self.ordinal]
            if tuple(was) == kind:
                storage.ident = ident
            else:
                self.idents[self.ordinal] = (storage.ident, *kind)
        else:
            self.idents.append((storage.ident, *kind))
        ref = weakref.ref(storage)
        if self.ordinal < len(self.storages):
            self.storages[self.ordinal] = ref
        else:
            self.storages.append(ref)
        self.ordinal += 1


_local = threading.local()         # per thread: the program instance it runs (LNC=2 runs two)


def _get() -> Optional[Launch]:
    return getattr(_local, "launch", None)


def current() -> Launch:
    """The running launch; outside a kernel, a default one (so tensors can be built in tests)
    for the target selected now (``use_target`` / the environment), made again when that changes:
    host code asking ``nisa.get_nc_version()`` must see the target the next launch runs on."""
    launch = getattr(_local, "launch", None)
    if launch is None or (launch.is_default and launch.target.name != get_target().name):
        from .memory import Memory
        target = get_target()
        launch = _local.launch = Launch(target=target, memory=Memory(target), is_default=True)
    return launch


@contextlib.contextmanager
def running(launch: Launch):
    saved, _local.launch = _get(), launch
    try:
        yield launch
    finally:
        _local.launch = saved


@functools.lru_cache(maxsize=None)
def in_simulator(filename: str) -> bool:
    """Whether code of ``filename`` belongs to this package (not to a kernel); cached (hot: read
    on every tensor dtype access)."""
    return os.path.abspath(filename).startswith(_PACKAGE_DIR + os.sep)


def kernel_location() -> Optional[str]:
    """``file:line`` of the innermost frame outside this package (the kernel's line)."""
    frame = sys._getframe(1)
    while frame is not None:
        if not in_simulator(frame.f_code.co_filename):
            return f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno}"
        frame = frame.f_back
    return None


def touch(tensor, time) -> None:
    """The instruction at ``time`` touches ``tensor``'s tile: its liveness (``memory``)."""
    storage = tensor._storage
    if storage.life is not None:
        note_use(storage, time, kernel_location)


def fail(cls, message: str, op: str = None, operand: str = None):
    """Raise ``cls(message)`` with the current program id and kernel line."""
    launch = _get()
    pid = launch.program_id if launch is not None and launch.trace is not None else None
    raise cls(message, op=op, operand=operand, program_id=pid, location=kernel_location())
