"""Launching kernels: ``nki.jit``, ``kernel[lnc](...)``, ``simulate(kernel)(...)``.

A launch wraps each host array argument as an HBM tensor over the same memory (so kernels that
write their inputs update them in place), runs every program instance of the grid in order (or
shuffled) with its own SBUF/PSUM accounting, and returns the kernel's result with tensors turned
into NumPy arrays (torch tensors when the inputs were torch tensors). Each launch is booked in
``compile_cache`` under the key the real ``nki.jit`` compiles by.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import gc
import threading
import inspect
import itertools
import math
import random
from typing import Optional

import numpy as np

from . import compile_cache, context, dtypes, subset
from .lnc import run_instances
from .ranks import is_torch, launch_ranks
from .blas_threads import one_blas_thread
from .memory import Memory
from .targets import get_target
from .tensor import _contiguous_strides, ndarray
from .trace import Trace

_last_trace: Optional[Trace] = None
_trace_sinks = []
_peaks_lock = threading.Lock()


def last_trace() -> Optional[Trace]:
    """The trace of the most recent launch."""
    return _last_trace


# nki.jit's keyword options: the compile/specialization configs of the current reference, the
# mode= of earlier releases, and the compiler flags AWS's nki-library kernels pass (the reference
# signature ends in **kwargs); anything else is refused as a likely typo. And the mode values.
JIT_OPTIONS = ("compile_config", "specialization_config", "mode", "debug_kernel",
               "show_compiler_tb", "experimental_flags")
JIT_MODES = ("auto", "jax", "torchxla", "simulation", "trace", "baremetal", "benchmark")


class Kernel:
    """A kernel function plus launch options. ``kernel(*args)`` runs one program instance;
    ``kernel[2](*args)`` runs two concurrently (LNC=2, ``nl.program_id(0)`` in {0, 1})."""

    def __init__(self, fn, grid=(), target=None, shuffle=False, seed=0, ranks=None,
                 schedule=(), **options):
        if "platform_target" in options:
            raise ValueError("platform_target= is not accepted by nki.jit since NKI 0.3.0; set "
                             "NEURON_PLATFORM_TARGET_OVERRIDE or simulate(kernel, target=...)")
        unknown = sorted(set(options) - set(JIT_OPTIONS))
        if unknown:
            raise TypeError(f"nki.jit got unknown option(s) {unknown}; it takes "
                            f"{', '.join(JIT_OPTIONS)}")
        if options.get("mode", "auto") not in JIT_MODES:
            raise ValueError(f"nki.jit mode={options['mode']!r} must be one of {JIT_MODES}")
        self.fn, self.grid, self.target = fn, tuple(grid), target
        self.shuffle, self.seed, self.options = shuffle, seed, options
        self.ranks = ranks
        self.schedule = tuple(schedule)
        functools.update_wrapper(self, fn)

    def with_schedule(self, edges) -> "Kernel":
        """The kernel with extra dependency edges (the NKI scheduling guide,
        "how-to-scheduling-apis"): ``edges`` is a list of (instruction name, name or list of
        names) pairs, the first depending on the others (``name=`` of the ``nisa`` calls).
        Execution here is in program order; the edges reach the trace (``details["after"]``,
        kind "schedule") for the cost model, and a name no instruction has is an error."""
        pairs = []
        for pair in edges:
            if not isinstance(pair, (tuple, list)) or len(pair) != 2 or not isinstance(pair[0], str):
                raise ValueError(f"with_schedule: {pair!r} must be a pair (name, name or list of "
                                 f"names)")
            after = [pair[1]] if isinstance(pair[1], str) else list(pair[1])
            if not after or not all(isinstance(n, str) for n in after):
                raise ValueError(f"with_schedule: {pair!r}: its second item must be an "
                                 f"instruction name or a non-empty list of names")
            pairs.append((pair[0], tuple(after)))
        return Kernel(self.fn, self.grid, self.target, self.shuffle, self.seed, self.ranks,
                      self.schedule + tuple(pairs), **self.options)

    def __getitem__(self, grid) -> "Kernel":
        """``kernel[lnc]``: Beta 2 takes exactly one integer, the logical core count 1 or 2 (the
        NKI "Using Logical Neuron Cores" overview: "The bracket syntax must contain only one
        number, the number of cores to use"); the multi-dimensional SPMD grids of Beta 1
        (``nl.spmd_dim``, ``nl.nc``, ``kernel[4, 2]``) are refused."""
        lnc = grid[0] if isinstance(grid, tuple) and len(grid) == 1 else grid
        if isinstance(lnc, tuple) or not isinstance(lnc, (int, np.integer)) or lnc not in (1, 2):
            raise ValueError(f"launch grid {grid!r}: NKI Beta 2 takes kernel[lnc] with lnc 1 or 2 "
                             f"(one integer, the number of cores, as the NKI LNC overview says; it "
                             f"matches NEURON_LOGICAL_NC_CONFIG); Beta 1 SPMD grids such as "
                             f"kernel[4, 2] are not accepted")
        return Kernel(self.fn, (int(lnc),), self.target, self.shuffle, self.seed, self.ranks,
                      self.schedule, **self.options)

    def __call__(self, *args, **kwargs):
        if self.ranks is not None:
            return launch_ranks(launch, self.fn, args, kwargs, self.ranks, grid=self.grid,
                                target=self.target)
        out = launch(self.fn, args, kwargs, grid=self.grid, target=self.target,
                     shuffle=self.shuffle, seed=self.seed)
        if self.schedule:
            schedule_edges(_last_trace, self.schedule)
        return out


def schedule_edges(trace, pairs) -> None:
    """Record ``with_schedule`` edges in ``trace``: each instruction named by a pair's first item
    runs after the nearest earlier instruction (of its program instance) named by each of the
    others. A name that no instruction has raises; so does a dependent issued before every
    instruction of a name it depends on (the simulator runs in program order)."""
    from .errors import UnsupportedError, ValidationError
    named = {}
    for e in trace:
        if e.name:
            named.setdefault(e.name, []).append(e)
    for dependent, producers in pairs:
        for name in (dependent,) + producers:
            if name not in named:
                raise ValidationError(f"no instruction is named {name!r} (the name= of a nisa "
                                      f"call)", op="with_schedule", operand=name)
        for d in named[dependent]:
            for name in producers:
                earlier = [p for p in named[name]
                           if p.program_id == d.program_id and p.index < d.index]
                if not earlier:
                    raise UnsupportedError(f"{dependent!r} is issued before {name!r}, which it "
                                           f"depends on; the simulator runs in program order, "
                                           f"so issue {name!r} first", op="with_schedule",
                                           operand=dependent)
                d.details.setdefault("after", []).append((earlier[-1].index, "schedule"))


def jit(fn=None, **options):
    """``@nki.jit`` / ``@nki.jit(...)``: the function as a launchable ``Kernel``."""
    if fn is None:
        return lambda f: Kernel(f, **options)
    return Kernel(fn, **options)


def simulate(kernel, target=None, shuffle=False, seed=0, ranks=None):
    """``simulate(kernel)(*args)``: run ``kernel`` (jit or plain, maybe ``kernel[lnc]``) on the CPU.

    Args:
        target: "trn1" | "trn2" | "trn3" (default: $NEURON_PLATFORM_TARGET_OVERRIDE or trn2).
        shuffle: run program instances in a seeded random order (catches order dependence).
        ranks: run a multi-rank (``nki.collectives``) job of this many ranks, concurrently; the
            call then returns a list of per-rank results (see ``simulate.ranks``).
    """
    fn = kernel.fn if isinstance(kernel, Kernel) else kernel
    grid = kernel.grid if isinstance(kernel, Kernel) else ()
    schedule = kernel.schedule if isinstance(kernel, Kernel) else ()
    return Kernel(fn, grid, target, shuffle, seed, ranks, schedule)


def simulate_kernel(func, args=(), kwargs=None, _lnc=1):
    """vllm-neuron's CPU entry (``nki.simulator.simulate_kernel``): run ``func`` on ``args``."""
    kernel = simulate(func)
    if _lnc and int(_lnc) > 1:
        kernel = kernel[int(_lnc)]
    return kernel(*args, **(kwargs or {}))


@contextlib.contextmanager
def _collector_paused():
    """Python's cyclic garbage collector off while a kernel runs, back as it was afterwards: a
    launch allocates a few objects per instruction and keeps them in its trace, so every
    collection pass re-scans the growing trace (a decode launch ran 6-20% faster without it in
    alternating runs; the benchmark's noise is larger). Cycles a launch leaves are collected
    after it."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def launch(fn, args, kwargs, grid=(), target=None, shuffle=False, seed=0, rank=0, job=None):
    """Run one launch; ``rank``/``job``: this launch's rank and the collectives rendezvous of a
    multi-rank job (``simulate.ranks``)."""
    with _collector_paused(), one_blas_thread():
        return _launch(fn, args, kwargs, grid, target, shuffle, seed, rank, job)


def _launch(fn, args, kwargs, grid, target, shuffle, seed, rank, job):
    global _last_trace
    target = get_target(target)
    subset.check_function(fn)
    names = _parameter_names(fn, len(args))
    for i, a in enumerate(args):
        subset.check_argument(a, names[i])
    for k, v in kwargs.items():
        subset.check_argument(v, k)
    precise_fp = dtypes.precise_fp()
    key = compile_cache.compile_key(args, kwargs, grid, target.name, precise_fp)
    trace = Trace(target)
    run = context.Launch(target=target, grid=grid, trace=trace, rank=rank, job=job,
                         precise_fp=precise_fp)
    with context.running(run):
        converter = _Converter("shared_hbm" if math.prod(grid or (1,)) > 1 else "private_hbm")
        args = tuple(converter.to_device(a, names[i]) for i, a in enumerate(args))
        kwargs = {k: converter.to_device(v, k) for k, v in kwargs.items()}
    instances = [tuple(p) for p in itertools.product(*map(range, grid))] if grid else [(0,)]
    if shuffle:
        random.Random(seed).shuffle(instances)

    def run_one(pid, meeting=None):
        instance = dataclasses.replace(run, program_id=pid, shared_hbm_cursor=0, loop_frames=[],
                                       while_loops=[], memory=Memory(target))
        instance.memory.now = lambda: instance.issued
        instance.meeting = meeting
        with context.running(instance):
            result = fn(*args, **kwargs)
        instance.memory.check_liveness(pid)
        with _peaks_lock:
            trace.memory_peaks = {
                "sbuf_bytes_per_partition": max(instance.memory.sbuf_peak,
                                                trace.memory_peaks.get("sbuf_bytes_per_partition", 0)),
                "psum_banks": max(instance.memory.psum_banks_peak,
                                  trace.memory_peaks.get("psum_banks", 0)),
            }
        return result

    if len(instances) > 1 and not shuffle:
        results = run_instances(run_one, instances)      # concurrently, as the cores run
        trace.canonicalise()                             # an order free of thread timing
        result = results[instances[-1]]
    else:
        result = None
        for pid in instances:
            result = run_one(pid)
    with context.running(run):
        converter.write_back()
        out = converter.to_host(result)
    trace.compiled = compile_cache.record(fn, key, trace)
    _last_trace = trace
    for sink in _trace_sinks:
        sink.append(trace)
    return out


def _parameter_names(fn, count):
    try:
        params = list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        params = []
    return [params[i] if i < len(params) else f"args[{i}]" for i in range(count)]


class _Converter:
    """Host arrays <-> HBM tensors for one launch: inputs arrive in ``nl.hbm`` (an alias of
    ``private_hbm``), or in ``shared_hbm`` under LNC=2, where both cores read them (the NKI
    simulator guide, "How It Works": "wrapped into an NkiTensor with buffer=nl.hbm (or
    shared_hbm for LNC2)")."""

    def __init__(self, buffer="private_hbm"):
        self.buffer = buffer
        self.copies = []          # (host array, contiguous copy) to write back after the launch
        self.torch_like = None
        self.hosts = {}           # id(storage) -> (storage, host object it wraps)

    def to_device(self, value, where: str):
        if isinstance(value, ndarray):
            return value
        if is_torch(value):
            self.torch_like = value
            tensor = self.to_device(_torch_to_numpy(value), where)
            self.hosts[id(tensor._storage)] = (tensor._storage, value)
            return tensor
        if isinstance(value, np.ndarray):
            if not dtypes.is_nki_dtype(value.dtype):
                raise TypeError(f"{where}: dtype {value.dtype.name} is not an NKI dtype (no 64-bit "
                                f"or complex types on NeuronCores); convert it on the host")
            if value.flags.c_contiguous and value.flags.writeable:
                tensor = ndarray._wrap(value, self.buffer, where)
            else:
                copy = np.ascontiguousarray(value)
                if value.flags.writeable:
                    self.copies.append((value, copy))
                tensor = ndarray._wrap(copy, self.buffer, where)
            self.hosts[id(tensor._storage)] = (tensor._storage, value)
            return tensor
        if isinstance(value, tuple):
            return tuple(self.to_device(v, f"{where}[{i}]") for i, v in enumerate(value))
        if isinstance(value, list):
            raise TypeError(f"{where}: list kernel arguments are not allowed; pass a tuple")
        return value

    def write_back(self):
        for host, copy in self.copies:
            host[...] = copy

    def to_host(self, value):
        if isinstance(value, ndarray):
            s = value._storage
            host = self.hosts.get(id(s))
            if (host is not None and host[0] is s and value.shape == s.shape
                    and value.offset == 0 and value.strides == _contiguous_strides(value.shape)
                    and value.dtype == s.dtype):
                return host[1]            # an input returned whole: the caller's own object
            array = s.data.reshape(s.shape).copy()
            if value.dtype != s.dtype or value.shape != s.shape:
                from .access import resolve
                array = resolve(value, "return", "result").read()
            return _numpy_to_torch(array, self.torch_like) if self.torch_like is not None else array
        if isinstance(value, tuple):
            return tuple(self.to_host(v) for v in value)
        if isinstance(value, list):
            return [self.to_host(v) for v in value]
        if isinstance(value, dict):
            return {k: self.to_host(v) for k, v in value.items()}
        return value


def _torch_to_numpy(t) -> np.ndarray:
    """A NumPy view of a CPU torch tensor (bf16/fp8 through their bit patterns)."""
    import torch
    if t.device.type != "cpu":
        raise TypeError(f"the simulator runs on CPU tensors; got a tensor on {t.device}")
    t = t.detach()
    special = {torch.bfloat16: (torch.int16, dtypes.bfloat16),
               getattr(torch, "float8_e4m3fn", None): (torch.uint8, dtypes.float8_e4m3fn),
               getattr(torch, "float8_e5m2", None): (torch.uint8, dtypes.float8_e5m2)}
    if t.dtype in special:
        bits, dtype = special[t.dtype]
        return t.view(bits).numpy().view(dtype)
    return t.numpy()


def _numpy_to_torch(array: np.ndarray, like):
    import torch
    mapping = {dtypes.bfloat16: (np.int16, torch.bfloat16),
               dtypes.float8_e4m3fn: (np.uint8, getattr(torch, "float8_e4m3fn", None)),
               dtypes.float8_e5m2: (np.uint8, getattr(torch, "float8_e5m2", None))}
    if array.dtype in mapping:
        bits, dtype = mapping[array.dtype]
        return torch.from_numpy(array.view(bits)).view(dtype)
    return torch.from_numpy(array)
