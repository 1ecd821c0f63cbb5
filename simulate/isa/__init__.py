"""``nki.isa`` in NumPy: Beta 2 names and argument order (``dst`` first), each call returns an
instruction handle and records a trace event."""

from .. import context as _context
from ..errors import NkiValidationError
from .basic import iota, memset, tensor_copy
from .core import Instruction

NkiInstruction = Instruction      # the documented name of an instruction's handle
from .dma import dma_copy
from ..registers import (NkiScalar, VirtualRegister, register_alloc, register_load, register_move,
                         register_store, scalar_load, scalar_store)
from . import constants
from ..lnc import core_barrier, sendrecv
from .enums import (dependency, dge_mode, dma_engine, engine, matmul_perf_mode, nc_version,
                    oob_mode, reduce_cmd)

# Deprecated engine aliases kept by NKI.
tensor_engine, scalar_engine, gpsimd_engine = engine.tensor, engine.scalar, engine.gpsimd
unknown_engine = engine.unknown


vector_engine = engine.vector


def get_nc_version() -> nc_version:
    """NeuronCore version of the selected target."""
    return nc_version(_context.current().target.nc_version)


def get_nc_sub_version() -> int:
    """Silicon revision within the NeuronCore generation (0: first; the simulator models that)."""
    return 0


try:  # compute instructions (matmul, activation, vector ops) live in their own modules
    from .compute import *  # noqa: F401,F403
except ImportError as _err:  # pragma: no cover - only while that module is being written
    if "compute" not in str(_err):
        raise


def _guarded(fn):
    """``fn`` raising only ``SimulationError``s: any other exception escaping it (a case its
    checks miss) becomes an ``InternalError`` naming the instruction and the kernel line."""
    import functools

    from ..errors import InternalError, SimulationError

    @functools.wraps(fn)
    def call(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except SimulationError:
            raise
        except Exception as error:           # noqa: BLE001 - re-raised, named, with its cause
            launch = _context._get()
            pid = launch.program_id if launch is not None and launch.trace is not None else None
            raise InternalError(f"{type(error).__name__}: {error} (a case the simulator does not "
                                f"check; please report it)", op=fn.__name__, program_id=pid,
                                location=_context.kernel_location()) from error
    call.__wrapped_instruction__ = fn
    return call


def _guard_instructions(namespace):
    import inspect
    for name, value in list(namespace.items()):
        if (not name.startswith("_") and inspect.isfunction(value)
                and _context.in_simulator(value.__code__.co_filename)
                and name not in ("get_nc_version", "get_nc_sub_version")):
            namespace[name] = _guarded(value)


_guard_instructions(globals())
