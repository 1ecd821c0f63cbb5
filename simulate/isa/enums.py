"""Enumerations of ``nki.isa`` (Beta 2 names and values)."""

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
    idle = "idle"
    reset = "reset"
    reduce = "reduce"
    reset_reduce = "reset_reduce"
    load_reduce = "load_reduce"


class dge_mode(enum.Enum):
    unknown = "unknown"
    swdge = "swdge"
    hwdge = "hwdge"
    none = "none"


class oob_mode(enum.Enum):
    error = "error"
    skip = "skip"


class matmul_perf_mode(enum.Enum):
    none = "none"
    double_row = "double_row"


class nc_version(enum.IntEnum):
    gen2 = 2
    gen3 = 3
    gen4 = 4


ENGINE_NAMES = {engine.tensor: "tensor", engine.scalar: "scalar", engine.gpsimd: "gpsimd",
                engine.dma: "dma", engine.vector: "vector", engine.sync: "sync"}
