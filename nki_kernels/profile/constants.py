"""Hardware figures of the cost model, one named field each, with its source.

Sources (see ../shared/reference/nki-api.md): [ARCH] NKI architecture guides (trn1/trn2), [NC]
neuron-core-v2/v3 pages, [ISA] Beta 1 ISA "estimated instruction cost", [DMA] NKI DMA overview and
bandwidth guide, [CHIP] Trainium/Trainium2 chip pages, [DGE] the NKI DGE reference
(``nki/deep-dives/nki-dge.rst``), [LIB] nki-library's dynamic flash-attention design notes
(``dynamic_fa_design_spec.md``: "~9 us/iter" of scheduling barrier, ~4 us double-buffered),
[DMA-OV] the NKI DMA overview (``nki/get-started/about/nki-dma-overview.rst``) and its profiles,
[PERF] the NKI performance guide (``nki/deep-dives/nki_perf_guide.rst``).
"(derived)" = our arithmetic on a source's figure; "(assumed)" = our modelling choice where no
source gives a number (listed in ``ASSUMED``; ``BANDS`` gives each uncertain one's range).
Override any field: ``hardware("trn2", hbm_bytes_per_s=3.0e11)``, ``nki-kernels profile ...
--set hbm_bytes_per_s=3e11``, or a fitted ``--calibration FILE`` (``nki_kernels/device/fit.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Dict

# constants with no public figure (the loop barrier: one kernel's design notes): the benchmark
# reports how the headline moves when each is halved and doubled (profile/sensitivity.py)
ASSUMED = ("dma_queues_in_flight", "swdge_cycles_per_descriptor", "loop_iteration_s")

# The plausible range of each constant no source pins down (or pins only roughly), as (its
# fastest value, its slowest): ``bench``, ``serve`` and ``profile`` print each headline ratio
# with its low and high over these (``sensitivity.band``).
BANDS = {
    "dma_queues_in_flight": (16, 8),            # up to the 16 queues [DMA-OV]
    "swdge_cycles_per_descriptor": (0, 8),      # the overview's trigger bounds direct DMAs only
    "loop_iteration_s": (4e-6, 9e-6),           # [LIB]: ~9 us a barrier, ~4 us double-buffered
    "dma_descriptor_bytes": (24, 256),          # derived from one profile; 256 the old guess
    "dma_fixed_s": (0.8e-6, 1.3e-6),            # [DMA-OV] trn2 ~0.8-1.0 us; [ISA] 1.3 us
}


@dataclass(frozen=True)
class Hardware:
    name: str
    tensor_hz: float              # TensorE clock [ARCH]
    vector_hz: float              # VectorE clock [ARCH]
    scalar_hz: float              # ScalarE clock [ARCH]
    gpsimd_hz: float              # GpSimd clock [ARCH]
    tensor_peak_bf16: float       # FLOP/s per NeuronCore, bf16/fp16/fp8 [NC]
    tensor_peak_fp32: float       # FLOP/s per NeuronCore, fp32 [NC]
    hbm_bytes_per_s: float        # per NeuronCore: chip HBM bandwidth / cores (derived from [CHIP])
    dma_bytes_per_s: float        # per NeuronCore, all 16 DMA engines [DMA] table (B/ns)
    dma_engines: int = 16         # per NeuronCore [DMA]
    partitions_per_dma_engine: int = 8    # a 128-partition transfer uses all 16 engines [DMA]
    dma_fixed_s: float = 1.3e-6   # semaphore-to-start overhead per DMA instruction [ISA]
    dma_queues_in_flight: int = 16        # DMAs whose fixed overhead overlaps (assumed: 16 queues [DMA])
    dma_descriptor_bytes: int = 32        # per contiguous run overhead, in bytes-equivalent (derived
                                          # from [DMA-OV]: an engine moves 8 rows x 256 B in ~97 ns,
                                          # 2 KiB at 23 B/ns being 89 ns: 24-32 B; 32 keeps [DMA-BW]'s
                                          # 128 B runs below half of peak)
    min_ii_cycles: int = 64       # minimum initiation interval, Vector/Scalar [ISA]
    static_overhead_cycles: int = 60      # SBUF/PSUM access overhead per instruction [ISA]
    gpsimd_start_cycles: int = 150        # GpSimd start-up [ISA]
    matmul_init_cycles: int = 64  # MM_INIT_LATENCY: least interval between matmuls [ARCH]
    fp32_matmul_factor: int = 4   # fp32 matmul is 4x slower than bf16 [ISA]
    reciprocal_factor: int = 8    # VectorE reciprocal ~8 N cycles [ISA]
    dependent_vector_cycles: int = 100    # a VectorE instruction reading the one just before [ISA]
    dependent_scalar_cycles: int = 140    # the same on ScalarE (derived from [PERF]: dependent
                                          # one-element activations issue every 264 cycles, 124
                                          # of them static overhead and MIN_II)
    hwdge_units: int = 2          # hardware DGE instances per NeuronCore-v3 [DGE]; none on v2
    hwdge_instruction_s: float = 600e-9   # per hardware-DGE DMA instruction [DGE]
    swdge_fixed_cycles: int = 10          # GpSimd trigger of a software-DGE DMA: ~8 ns in the
                                          # [DMA-OV] profile of a 128-row load (derived)
    swdge_cycles_per_descriptor: int = 8  # GpSimd cycles per row descriptor of an indirect
                                          # (vector_offset) DMA (assumed: [DGE] says software DGE
                                          # "consumes GpSimd cycles", no figure)
    loop_iteration_s: float = 9e-6        # barrier per device-loop iteration [LIB]
    launch_overhead_s: float = 0.0        # per kernel launch, host to device and back: no public
                                          # figure, 0 here; ``calibrate --fit`` measures it

    def assumed(self) -> Dict[str, float]:
        """The constants no public source gives a figure for, with their values."""
        return {name: getattr(self, name) for name in ASSUMED}

    def override(self, **changes) -> "Hardware":
        known = {f.name for f in fields(self)}
        unknown = set(changes) - known
        if unknown:
            raise ValueError(f"unknown hardware constant(s) {sorted(unknown)}; known: {sorted(known)}")
        return replace(self, **changes)


TRN1 = Hardware("trn1", tensor_hz=2.8e9, vector_hz=1.12e9, scalar_hz=1.4e9, gpsimd_hz=1.4e9,
                tensor_peak_bf16=92e12, tensor_peak_fp32=23e12, hwdge_units=0,
                hbm_bytes_per_s=820e9 / 2,          # 820 GB/s per chip, 2 NeuronCores
                dma_bytes_per_s=17e9 * 16)          # 17 B/ns per engine x 16 = 272 GB/s
TRN2 = Hardware("trn2", tensor_hz=2.4e9, vector_hz=0.96e9, scalar_hz=1.2e9, gpsimd_hz=1.2e9,
                tensor_peak_bf16=79e12, tensor_peak_fp32=20e12,
                dma_fixed_s=1.0e-6,                 # [DMA-OV] trn2 profiles: a static DMA's data
                                                    # starts ~0.8-1.0 us after its trigger
                hbm_bytes_per_s=2.9e12 / 8,         # 2.9 TB/s per chip, 8 NeuronCores
                dma_bytes_per_s=23e9 * 16)          # 23 B/ns per engine x 16 = 368 GB/s
HARDWARE = {"trn1": TRN1, "trn2": TRN2}


def hardware(target: str = "trn2", **overrides) -> Hardware:
    try:
        hw = HARDWARE[target]
    except KeyError:
        raise ValueError(f"no cost model for target {target!r}; choose from {sorted(HARDWARE)}") from None
    return hw.override(**overrides) if overrides else hw
