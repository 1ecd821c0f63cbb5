"""Which kernel launches a host entry makes, so each can be benchmarked on its own.

On a device backend (the Neuron SDK, or its rehearsal) ``nki_kernels.backend.nki`` is a
``DeviceNki``: the SDK's module with ``jit`` returning a ``RecordedKernel``, which notes every
launch (the kernel function, its LNC grid and arguments) while a ``recording()`` is open and
otherwise only forwards the call. Kernel sources are unchanged (``@nki.jit``).
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import NamedTuple

_recorders: list = []


class Launch(NamedTuple):
    fn: object          # the kernel's Python function (what nki.benchmark takes)
    grid: object        # the launch grid (LNC), or None
    args: tuple
    kwargs: dict


@contextmanager
def recording():
    """Collect the launches made inside the block, in order (a list of ``Launch``)."""
    launches: list = []
    _recorders.append(launches)
    try:
        yield launches
    finally:
        _recorders.remove(launches)


class RecordedKernel:
    """A jit kernel that notes its launches; attributes and ``kernel[grid]`` pass through."""

    def __init__(self, inner, fn, grid=None):
        self._inner, self.fn, self.grid = inner, fn, grid

    def __call__(self, *args, **kwargs):
        for launches in _recorders:
            launches.append(Launch(self.fn, self.grid, args, kwargs))
        return self._inner(*args, **kwargs)

    def __getitem__(self, grid):
        return RecordedKernel(self._inner[grid], self.fn, grid)

    def __getattr__(self, name):
        return getattr(self._inner, name)


class DeviceNki:
    """The ``nki`` module kernels see on a device backend: ``jit`` records launches,
    ``benchmark`` is the SDK's (or the rehearsal's stand-in); the rest is the module's own."""

    def __init__(self, module, benchmark=None):
        self._module = module
        self._benchmark = benchmark

    def jit(self, fn=None, **options):
        if fn is None:
            return lambda f: self.jit(f, **options)
        inner = self._module.jit(fn, **options) if options else self._module.jit(fn)
        return RecordedKernel(inner, fn)

    def benchmark(self, kernel=None, **options):
        bench = self._benchmark or self._module.benchmark
        return bench(kernel, **options) if kernel is not None else bench(**options)

    def __getattr__(self, name):
        return getattr(self._module, name)
