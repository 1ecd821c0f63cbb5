"""What ``nki.jit`` would compile: one program per (shapes, dtypes, non-tensor arguments) key.

The real ``nki.jit`` traces and compiles a kernel once per key and reuses the binary for every
later call with the same key, whatever the tensors hold. The simulator runs every call, but
keeps the same books: a compilation for a new key, a cache hit for a known one, per kernel
function, so a serving loop can be checked for recompiles (``compile_stats()``).

It also checks the promise the cache relies on: the instructions a launch issues outside device
loops must be the same for every call with one key. When they differ the kernel took a Python
decision from something that is not in the key (a host global, the clock, the data through a
side channel); on hardware the cached program would silently keep the first call's decision, so
the simulator raises ``CompileKeyError`` naming the first differing instruction.

Key parts: a tensor argument contributes (shape, dtype); a tuple its parts; anything else its
type and value (``repr`` for values that do not hash). The launch grid and target join the key.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Dict, Tuple

import numpy as np

from .errors import SimulationError


class CompileKeyError(SimulationError):
    """Two launches with one compile key issued different programs."""


@dataclass
class KernelCompiles:
    """The books of one kernel function."""

    name: str
    compilations: int = 0
    hits: int = 0
    programs: Dict[tuple, tuple] = field(default_factory=dict)    # key -> static program

    @property
    def keys(self) -> Tuple[tuple, ...]:
        return tuple(self.programs)

    def as_dict(self) -> dict:
        return {"kernel": self.name, "compilations": self.compilations, "hits": self.hits}


_books: Dict[object, KernelCompiles] = {}
_lock = threading.Lock()


def _part(value):
    if hasattr(value, "shape") and hasattr(value, "dtype"):
        dtype = getattr(value.dtype, "name", None) or str(value.dtype)
        return ("tensor", tuple(int(n) for n in value.shape), dtype)
    if isinstance(value, tuple):
        return ("tuple",) + tuple(_part(v) for v in value)
    if isinstance(value, (bool, int, float, str, type(None), np.integer, np.floating)):
        return (type(value).__name__, value)
    try:
        hash(value)
        return (type(value).__name__, value)
    except TypeError:
        return (type(value).__name__, repr(value))


def compile_key(args, kwargs, grid, target_name, precise_fp=True) -> tuple:
    """The key ``nki.jit`` compiles under for these host arguments (plus the simulator's
    ``NKI_PRECISE_FP=0`` setting, which changes the dtypes a kernel allocates)."""
    key = (tuple(_part(a) for a in args), tuple(sorted((k, _part(v)) for k, v in kwargs.items())),
           tuple(grid), target_name)
    return key if precise_fp else key + ("NKI_PRECISE_FP=0",)


def static_program(trace) -> tuple:
    """Instructions outside device loops, per program instance, as (op, operands) with static
    shapes, dtypes, patterns and (non-dynamic) offsets: what one compiled binary fixes."""
    rows = []
    outside = (e for e in trace.events if not e.loop_depth)
    for e in sorted(outside, key=lambda e: (e.program_id, e.index)):
        ops = tuple((o.role, o.buffer, o.dtype, o.shape, o.pattern,
                     o.offset if o.indirect is None else None) for o in e.operands)
        rows.append((e.program_id, e.op, ops))
    return tuple(rows)


def record(fn, key, trace) -> bool:
    """Book one launch of ``fn``; True when it compiled (a new key). Raises ``CompileKeyError``
    when a known key issued a different static program."""
    program = static_program(trace) if trace is not None else ()
    with _lock:
        books = _books.setdefault(fn, KernelCompiles(getattr(fn, "__qualname__", repr(fn))))
        known = books.programs.get(key)
        if known is None:
            books.programs[key] = program
            books.compilations += 1
            return True
        books.hits += 1
    if known != program:
        first = next((i for i, (a, b) in enumerate(zip(known, program)) if a != b),
                     min(len(known), len(program)))
        was = known[first][1] if first < len(known) else "(end of program)"
        now = program[first][1] if first < len(program) else "(end of program)"
        raise CompileKeyError(
            f"kernel {books.name}: two calls with the same compile key issued different programs "
            f"(instruction {first} outside device loops: {was} then {now}). The kernel decided "
            f"something in Python from a value that is not a shape, dtype or non-tensor "
            f"argument; on hardware the cached binary would keep the first call's decision")
    return False


def compile_stats(kernel=None):
    """Compilations and cache hits: of one kernel (a jit object or function) as a dict, or of
    every kernel launched since the last ``reset_compile_stats()`` as a list of dicts."""
    with _lock:
        if kernel is not None:
            fn = getattr(kernel, "fn", kernel)
            books = _books.get(fn)
            return (books or KernelCompiles(getattr(fn, "__qualname__", repr(fn)))).as_dict()
        return [b.as_dict() for b in _books.values()]


def compile_keys(kernel) -> Tuple[tuple, ...]:
    """The distinct compile keys a kernel was launched with."""
    books = _books.get(getattr(kernel, "fn", kernel))
    return books.keys if books else ()


def reset_compile_stats() -> None:
    with _lock:
        _books.clear()

