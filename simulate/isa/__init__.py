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
