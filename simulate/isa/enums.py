"""Enumerations of ``nki.isa`` with the documented members and values (NKI 0.6 reference), so the
integers real kernels pass convert: ``dge_mode(3) is dge_mode.none``, ``reduce_cmd(3)`` is
``reset_reduce``. Also importable as ``nki.isa.constants``."""

import enum


class engine(enum.IntEnum):
    unknown = 0
    tensor = 1
    scalar = 2
    gpsimd = 3
    dma = 4
    vector = 5
    sync = 6


class reduce_cmd(enum.Enum):
    idle = 0
    reset = 1
    reduce = 2
    reset_reduce = 3
    load_reduce = 4


class dge_mode(enum.Enum):
    unknown = 0
    swdge = 1
    hwdge = 2
    none = 3


class dependency(enum.Enum):
    """Kind of an ``NkiInstruction.depends_on`` edge: ``runtime`` waits on a hardware semaphore,
    ``schedule`` only orders issue for the compiler's schedulers."""
    runtime = "runtime"
    schedule = "schedule"


class oob_mode(enum.Enum):
    error = 0
    skip = 1


class matmul_perf_mode(enum.Enum):
    none = "none"
    double_row = "double_row"


class nc_version(enum.IntEnum):
    gen2 = 2
    gen3 = 3
    gen4 = 4


class dma_engine(enum.Enum):
    """Engine of an LNC=2 ``sendrecv``: the shared DMA rings, or GpSimd's own DMA (SBUF to SBUF)."""
    dma = 1
    gpsimd_dma = 2


ENGINE_NAMES = {engine.tensor: "tensor", engine.scalar: "scalar", engine.gpsimd: "gpsimd",
                engine.dma: "dma", engine.vector: "vector", engine.sync: "sync"}
