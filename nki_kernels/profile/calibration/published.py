"""Figures AWS publishes, and what the cost model makes of the same work.

Each ``Figure`` names its source, the published value, how the model is run on the same work
(an instruction stream through the simulator, or a hand-built trace of the transfer described),
and the tolerance within which the model is said to reproduce it. ``run_all()`` evaluates them;
``nki-kernels calibrate`` prints the table; tests/profile/test_calibration.py asserts each figure
is reproduced, or, for the ones listed as not reproduced, that it still is not (so a model
change that moves a figure shows up and the README's statement is revisited).

Sources:
- [DMA-BW] NKI DMA bandwidth guide (``nki/deep-dives/nki-dma-bandwidth-guide.rst``): aggregate
  DMA bandwidth per NeuronCore (trn1 272 GB/s, trn2 368 GB/s) at >= 4 KiB per partition, "approaches
  peak" at >= 2 KiB, "a small fraction of peak" below 256 B; 16 engines, 8 partitions each.
- [ISA] the Beta 1 ISA reference's estimated instruction costs (see constants.py).
- [ARCH] the NeuronCore-v2 architecture guide (``nki/guides/architecture/trainium_inferentia2_arch.rst``):
  back-to-back MultiplyMoving instructions issue every max(N, MM_INIT_LATENCY) cycles, N the
  moving free size, MM_INIT_LATENCY 64; fp32 inputs about 4x.
- [MAMBA] the NKI fused-Mamba tutorial (``nki/guides/tutorials/fused_mamba.rst``): measured
  device time of mamba_v1 at [batch 1, seq 512, channels 256, state 16] = 172.93 us; of mamba_v1
  with 4096 channels = 2.34 ms; of mamba_v2 (loop reordering) with 4096 channels = 1.61 ms. fp32.
  The tutorial does not name the instance; it predates NKI on Trainium2, so trn1 is assumed.
  (Its mamba_v2 at seq_len 8192, 53.33 ms, and mamba_v3, 27.8 ms, are not rows: the first spills
  SBUF, which the simulator refuses rather than models; the second's kernel is not written here.)
More measured device times, and their sources, are in ``measured.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, List

import numpy as np

from ..constants import hardware


@dataclass(frozen=True)
class Figure:
    name: str
    source: str
    published: float
    unit: str
    model: Callable[[], float]
    tolerance: float            # reproduced when |model / published - 1| <= tolerance
    bound: str = "="            # "=": within tolerance; ">=": model >= published x (1 - tol);
                                # "<=": model <= published x (1 + tol)
    reproduced: bool = True     # False: known not to be reproduced (said so in the README)

    def evaluate(self):
        value = self.model()
        ratio = value / self.published
        if self.bound == ">=":
            ok = ratio >= 1 - self.tolerance
        elif self.bound == "<=":
            ok = ratio <= 1 + self.tolerance
        else:
            ok = abs(ratio - 1) <= self.tolerance
        return value, ratio, ok


# -- DMA streams (hand-built traces of the transfers the guide describes) -----------------------

def _hbm_to_sbuf(trace, partitions: int, elems: int, tile: int, start: int = 0):
    """Add one HBM->SBUF DMA of ``partitions`` rows x ``elems`` fp32, one contiguous run per
    row, into SBUF tile ``tile`` from element ``start`` of one HBM tensor."""
    from nki_kernels.simulate.trace import Operand

    nbytes = partitions * elems * 4
    dst = Operand("dst", "t", "sbuf", "float32", (partitions, elems),
                  ((elems, partitions), (1, elems)), 0, None, tile, elems * 4)
    src = Operand("src", "h", "shared_hbm", "float32", (partitions * elems,),
                  ((1, partitions * elems),), start, None, 1)
    return trace.add(op="dma_copy", engine="dma", program_id=(0,), operands=(dst, src),
                     dma_bytes=nbytes, dma_runs=partitions, hbm_read_bytes=nbytes)


def dma_stream_bandwidth(target: str, bytes_per_partition: int, partitions: int = 128,
                         count: int = 32) -> float:
    """Achieved bytes/s of ``count`` independent HBM->SBUF DMAs of ``partitions`` rows, one
    contiguous run of ``bytes_per_partition`` each, in the schedule."""
    from nki_kernels import simulate
    from nki_kernels.simulate.trace import Trace
    from ..cost_model import estimate

    trace = Trace(simulate.get_target(target))
    elems = bytes_per_partition // 4
    for i in range(count):
        _hbm_to_sbuf(trace, partitions, elems, 1000 + i, i * partitions * elems)
    return count * partitions * elems * 4 / estimate(trace).seconds


def single_dma_rate(target: str, bytes_per_partition: int, partitions: int) -> float:
    """Bytes/s one DMA moves once started (its fixed latency excluded)."""
    from nki_kernels import simulate
    from nki_kernels.simulate.trace import Trace
    from ..schedule import dma_transfer_seconds

    e = _hbm_to_sbuf(Trace(simulate.get_target(target)), partitions, bytes_per_partition // 4, 2)
    return e.dma_bytes / dma_transfer_seconds(e, hardware(target))


# -- ISA cost formulas through the simulator's own instructions --------------------------------

def modelled_cycles(target: str, build) -> float:
    """Cycles the model gives the one compute instruction ``build()`` issues in a kernel."""
    from nki_kernels import simulate
    from ..cost_model import compute_seconds, _cycles

    @simulate.jit
    def kernel(x):
        build()
        return x

    with simulate.use_target(target):
        simulate.simulate(kernel)(np.zeros((1, 1), np.float32))
    events = [e for e in simulate.last_trace() if e.engine != "dma"]
    hw = hardware(target)
    cycles, clock = _cycles(events[-1], hw)
    assert abs(compute_seconds(events[-1], hw) - cycles / clock) < 1e-15
    return cycles


def _matmul(dtype, n):
    def build():
        from nki_kernels.simulate import nisa, nl
        s = nl.ndarray((128, 128), dtype, buffer=nl.sbuf)
        m = nl.ndarray((128, n), dtype, buffer=nl.sbuf)
        nisa.memset(dst=s, value=0.0)
        nisa.memset(dst=m, value=0.0)
        p = nl.ndarray((128, n), nl.float32, buffer=nl.psum)
        nisa.nc_matmul(dst=p, stationary=s, moving=m)
    return build


def _activation(n):
    def build():
        from nki_kernels.simulate import nisa, nl
        x = nl.ndarray((128, n), nl.float32, buffer=nl.sbuf)
        nisa.memset(dst=x, value=0.0)
        nisa.activation(dst=x, op=nl.exp, data=x)
    return build


def _tensor_tensor(n):
    def build():
        from nki_kernels.simulate import nisa, nl
        x = nl.ndarray((128, n), nl.float32, buffer=nl.sbuf)
        nisa.memset(dst=x, value=0.0)
        nisa.tensor_tensor(dst=x, data1=x, data2=x, op=nl.add)
    return build


def _iota(n):
    def build():
        from nki_kernels.simulate import nisa, nl
        x = nl.ndarray((128, n), nl.int32, buffer=nl.sbuf)
        nisa.iota(dst=x, pattern=[[1, n]], offset=0, channel_multiplier=0)
    return build


# -- the fused-Mamba tutorial's kernel ---------------------------------------------------------

def mamba_seconds(order: str, channels: int, seq: int = 512, state: int = 16, batch: int = 1,
                  target: str = "trn1") -> float:
    """Modelled time of the Mamba kernel (mamba.py) on random inputs; checks the result."""
    from nki_kernels import simulate
    from ..cost_model import estimate
    from .mamba import mamba_inputs, mamba_kernel, mamba_ref

    delta, u, A, B, C = mamba_inputs(np.random.default_rng(0), batch, channels, seq, state)
    with simulate.use_target(target):
        out = simulate.simulate(mamba_kernel)(delta, u, A, B, C, order)
    ref = mamba_ref(delta, u, A, B, C)
    err = np.abs(out - ref).max() / max(1.0, np.abs(ref).max())
    if err > 1e-3:
        raise AssertionError(f"mamba kernel differs from its reference: {err}")
    return estimate(simulate.last_trace()).seconds


def _figures() -> List[Figure]:
    figs = []
    for target, peak in (("trn1", 272e9), ("trn2", 368e9)):
        figs += [
            Figure(f"{target} DMA bandwidth, 128 partitions x 4 KiB", "[DMA-BW]", peak, "B/s",
                   lambda t=target: dma_stream_bandwidth(t, 4096), 0.10),
            Figure(f"{target} DMA bandwidth, 128 x 2 KiB ('approaches peak')", "[DMA-BW]",
                   peak, "B/s", lambda t=target: dma_stream_bandwidth(t, 2048), 0.20),
            Figure(f"{target} DMA bandwidth, 128 x 128 B ('small fraction of peak')", "[DMA-BW]",
                   0.5 * peak, "B/s", lambda t=target: dma_stream_bandwidth(t, 128), 0.0, "<="),
            Figure(f"{target} one DMA of 4 partitions x 4 KiB (one engine of 16)", "[DMA-BW]",
                   peak / 16, "B/s", lambda t=target: single_dma_rate(t, 4096, 4), 0.0, "<="),
        ]
    figs += [
        Figure("nc_matmul bf16 128x128 @ 128x512: max(N, MM_INIT_LATENCY)", "[ARCH]", 512,
               "cycles", lambda: modelled_cycles("trn1", _matmul("bfloat16", 512)), 0.0),
        Figure("nc_matmul bf16 128x128 @ 128x32: MM_INIT_LATENCY 64", "[ARCH]", 64,
               "cycles", lambda: modelled_cycles("trn1", _matmul("bfloat16", 32)), 0.0),
        Figure("nc_matmul fp32 128x128 @ 128x512: x4", "[ARCH]", 4 * 512, "cycles",
               lambda: modelled_cycles("trn1", _matmul("float32", 512)), 0.0),
        Figure("activation N=1024: static overhead + N", "[ISA]", 60 + 1024, "cycles",
               lambda: modelled_cycles("trn1", _activation(1024)), 0.0),
        Figure("activation N=16: MIN_II", "[ISA]", 60 + 64, "cycles",
               lambda: modelled_cycles("trn1", _activation(16)), 0.0),
        Figure("tensor_tensor N=512: two inputs, 2N", "[ISA]", 60 + 1024, "cycles",
               lambda: modelled_cycles("trn1", _tensor_tensor(512)), 0.0),
        Figure("iota N=512: GpSimd start + N", "[ISA]", 150 + 512, "cycles",
               lambda: modelled_cycles("trn1", _iota(512)), 0.0),
        Figure("mamba_v1 [1, 512, 256, 16] fp32 (trn1 assumed)", "[MAMBA]", 172.93e-6, "s",
               lambda: mamba_seconds("state_outer", 256), 0.25),
        Figure("mamba_v1 with 4096 channels", "[MAMBA]", 2.34e-3, "s",
               lambda: mamba_seconds("state_outer", 4096), 0.25),
        Figure("mamba_v2 with 4096 channels (loop reordering)", "[MAMBA]", 1.61e-3, "s",
               lambda: mamba_seconds("tile_outer", 4096), 0.25, reproduced=False),
    ]
    from .measured import figures as measured_figures
    return figs + measured_figures(Figure)


FIGURES = _figures()


def run_all(figures=None):
    """[(figure, modelled, ratio, ok)] for every figure."""
    return [(f, *f.evaluate()) for f in (FIGURES if figures is None else figures)]


def markdown(results) -> str:
    lines = ["| figure | source | published | modelled | model / published | tolerance | "
             "reproduced |", "|---|---|---|---|---|---|---|"]
    for f, value, ratio, ok in results:
        tol = {"=": f"±{f.tolerance:.0%}", ">=": f">= -{f.tolerance:.0%}",
               "<=": f"<= +{f.tolerance:.0%}"}[f.bound]
        fmt = (lambda v: f"{v / 1e9:.0f} GB/s") if f.unit == "B/s" else \
            (lambda v: f"{v * 1e9:.0f} ns" if v < 1e-6 else f"{v * 1e6:.1f} us") \
            if f.unit == "s" else (lambda v: f"{v:.0f}")
        lines.append(f"| {f.name} | {f.source} | {fmt(f.published)} | {fmt(value)} | "
                     f"{ratio:.2f} | {tol} | {'yes' if ok else 'NO'} |")
    return "\n".join(lines)
