"""``nki.isa.constants``: the instruction enums, importable as
``from nki.isa.constants import dge_mode, oob_mode``."""

from .enums import (dge_mode, dma_engine, engine, matmul_perf_mode, nc_version, oob_mode,
                    reduce_cmd)

__all__ = ["dge_mode", "dma_engine", "engine", "matmul_perf_mode", "nc_version", "oob_mode",
           "reduce_cmd"]
