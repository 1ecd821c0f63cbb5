"""Hardware limits per NeuronCore generation, selected by target name.

Figures from ../shared/reference/nki-api.md section 7 (NKI architecture guides, KLR tile sizes).
Choices where sources are unclear:
- Indirect DMA through ``vector_offset`` is modelled as NeuronCore-v3+ only (the DGE reference lists
  indirect software DGE as "v3+"); kernels give trn1 a path with one dynamic-offset DMA per row/page.
- Hardware DGE (``dge_mode.hwdge``) exists from v3.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass


@dataclass(frozen=True)
class Target:
    """Limits of one NeuronCore generation (per NeuronCore, per partition where stated)."""

    name: str                   # canonical name: "trn1", "trn2", "trn3"
    nc_version: int             # NeuronCore version: 2, 3, 4
    pmax: int = 128             # partitions of SBUF and PSUM
    sbuf_partition_bytes: int = 196608      # physical SBUF bytes per partition
    sbuf_usable_bytes: int = 180224         # tile_size.total_available_sbuf_size
    psum_partition_bytes: int = 16384       # 8 banks x 2 KiB
    psum_bank_bytes: int = 2048             # one bank: 512 fp32
    psum_num_banks: int = 8
    gemm_stationary_fmax: int = 128         # nc_matmul: M (stationary free size)
    gemm_moving_fmax: int = 512             # tile_size.gemm_moving_fmax: one PSUM bank of fp32
    matmul_moving_max: int = 512            # nc_matmul's own limit on N for an fp32 dst
    indirect_dma: bool = True               # dma_copy with .ap(vector_offset=...)
    hwdge: bool = True                      # dge_mode.hwdge available

    @property
    def psum_fmax(self) -> int:
        return self.psum_bank_bytes // 4


TRN1 = Target("trn1", 2, sbuf_partition_bytes=196608, sbuf_usable_bytes=180224,
              indirect_dma=False, hwdge=False)
TRN2 = Target("trn2", 3, sbuf_partition_bytes=229376, sbuf_usable_bytes=212984)
# NeuronCore-v4: nc_matmul takes N up to 4096 for an fp32 dst (8192 bf16), eight PSUM banks
# (SDK nki/api/nki/isa nc_matmul); tile_size.gemm_moving_fmax stays 512, as on every generation
# (AWS's NKI front-end, KLR Trace/Kernel.lean kernelEnv, and the Trainium3 architecture guide's
# [128, 512] moving tile).
TRN3 = Target("trn3", 4, sbuf_partition_bytes=262144, sbuf_usable_bytes=245752,
              matmul_moving_max=4096)

TARGETS = {"trn1": TRN1, "trn2": TRN2, "trn3": TRN3}
_ALIASES = {"trn1": TRN1, "inf2": TRN1, "gen2": TRN1, "trn2": TRN2, "gen3": TRN2,
            "trn3": TRN3, "gen4": TRN3}
TARGET_ENV = "NEURON_PLATFORM_TARGET_OVERRIDE"
DEFAULT_TARGET = "trn2"


_override = []


def get_target(name=None) -> Target:
    """The target called ``name`` (a Target passes through). None: the innermost ``use_target``,
    else ``$NEURON_PLATFORM_TARGET_OVERRIDE``, else the default ``trn2``."""
    if isinstance(name, Target):
        return name
    name = name or (_override[-1] if _override else None) or os.environ.get(TARGET_ENV) or DEFAULT_TARGET
    try:
        return _ALIASES[str(name).lower()]
    except KeyError:
        raise ValueError(f"target={name!r} is not one of {sorted(_ALIASES)}") from None


@contextlib.contextmanager
def use_target(name):
    """Launches inside the block default to target ``name``."""
    target = get_target(name)
    _override.append(target.name)
    try:
        yield target
    finally:
        _override.pop()
