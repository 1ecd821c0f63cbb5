"""A NumPy simulator of the NKI Beta 2 API (``nki.jit``, ``nki.language``, ``nki.isa``).

Use it directly::

    from nki_kernels.simulate import nl, nisa, jit, simulate
    out = simulate(my_kernel, target="trn1")(x)

or let it stand in for ``nki`` so unmodified kernels run on a CPU::

    from nki_kernels import simulate; simulate.install()
    import nki, nki.language as nl, nki.isa as nisa
"""

if __name__ == "simulate":       # imported by its old top-level name (a source checkout on sys.path)
    raise ImportError("the simulate package installs as nki_kernels.simulate: "
                      "`from nki_kernels import simulate` (the top-level name `simulate` is "
                      "not used: it collides with other PyPI packages)")


from . import isa as nisa
from . import language as nl
from .errors import (AccessError, CapacityError, NkiValidationError, OutOfBoundsError,
                     SimulationError, TargetError, UnsupportedError, ValidationError)
from .compile_cache import CompileKeyError, compile_keys, compile_stats, reset_compile_stats
from .nki_module import build_modules, install, patched, uninstall
from .launch import Kernel, jit, last_trace, simulate
from .ranks import per_rank
from .targets import TARGETS, Target, get_target, use_target
from .trace import Event, Operand, Trace

__all__ = [
    "nl", "nisa", "jit", "simulate", "per_rank", "Kernel", "last_trace", "install", "uninstall",
    "patched",
    "Target", "TARGETS", "get_target", "use_target", "Trace", "Event", "Operand", "SimulationError",
    "ValidationError", "NkiValidationError", "AccessError", "OutOfBoundsError", "CapacityError",
    "TargetError", "UnsupportedError", "to_numpy", "tracing", "compile_stats", "compile_keys",
    "reset_compile_stats", "CompileKeyError",
]


def to_numpy(t):
    """The current values of an ``nl.ndarray`` view as a NumPy array (for debugging and tests)."""
    from .access import resolve
    return resolve(t, "to_numpy", "tensor").read()


def tracing():
    """``with simulate.tracing() as traces:`` collects the Trace of every launch in the block."""
    import contextlib

    from . import launch as _jit

    @contextlib.contextmanager
    def _collect():
        traces = []
        _jit._trace_sinks.append(traces)
        try:
            yield traces
        finally:
            _jit._trace_sinks.remove(traces)
    return _collect()
