"""Device times others measured, beside what the model makes of the same work (more of
``published.py``'s figures: measurements, not the cost formulas the model is built from).

Sources:
- [DMA-OV] the NKI DMA overview (``nki/get-started/about/nki-dma-overview.rst``), trn2 profiles:
  A[4, 4096] bf16 HBM->SBUF, the one active engine busy 1416 ns; A[128, 128] bf16, each of the
  16 engines one 2 KiB read in ~97 ns; the same load on the software DGE (qGpSimdDynamic): its
  GpSimd trigger ~8 ns and the DMA done ~1.2 us after it; a static DMA's data starting ~0.8-1.0
  us after its trigger (read off the profile screenshots).
- [PERF] the NKI performance guide (``nki/deep-dives/nki_perf_guide.rst``): back-to-back
  dependent ScalarE ``activation`` instructions on one element per partition issue every ~189 ns
  (264 ScalarE cycles) on NeuronCore-v2.
- [LIB] nki-library's dynamic flash-attention design notes: a device-loop iteration costs ~9 us
  of scheduling barrier (the source of ``loop_iteration_s``, so this row cannot disagree).
- [TRNSCI] trnblas benchmarks (trnsci.dev/trnblas/benchmarks, trn1.2xlarge, neuronxcc 2.24):
  an NKI GEMM per call through torch, warm, 512^3 1.3 ms and 1024^3 2.3 ms; trntensor's
  48x128 einsum (295 kFLOP) 1047 us per call. Host dispatch and transfers dominate: the model
  prices device time only, so these are not reproduced; they bound a per-call overhead through
  torch-xla at about 1 ms.
"""

from __future__ import annotations

import numpy as np


def _bf16():
    import ml_dtypes
    return ml_dtypes.bfloat16


def _load_kernel(P, F, dge):
    from nki_kernels import simulate
    from nki_kernels.simulate import nisa, nl

    @simulate.jit
    def load(a):
        tile = nl.ndarray((P, F), nl.bfloat16, buffer=nl.sbuf, name="tile")
        if dge:
            nisa.dma_copy(dst=tile, src=a, dge_mode=getattr(nisa.dge_mode, dge))
        else:
            nisa.dma_copy(dst=tile, src=a)
        out = nl.ndarray((P, F), nl.bfloat16, buffer=nl.shared_hbm, name="out")
        nisa.dma_copy(dst=out, src=tile)
        return out
    return load


def overview_load(P, F, dge=None, what="transfer", target="trn2"):
    """The DMA overview's load of A[P, F] bf16 into SBUF, run in the simulator and scheduled:
    ``what`` = "transfer" (the DMA once started: per-engine time), "trigger" (its GpSimd
    descriptor slot), "total" (trigger to done)."""
    from nki_kernels import simulate
    from ..constants import hardware
    from ..cost_model import estimate
    from ..schedule import dma_transfer_seconds
    a = np.arange(P * F).reshape(P, F).astype(_bf16())
    with simulate.use_target(target):
        out = simulate.simulate(_load_kernel(P, F, dge))(a)
    assert np.array_equal(out.view(np.uint16), a.view(np.uint16))
    trace = simulate.last_trace()
    load = next(e for e in trace if e.engine == "dma")
    if what == "transfer":
        return dma_transfer_seconds(load, hardware(target))
    slots = [s for s in estimate(trace).schedule.slots if s.index == load.index]
    if what == "trigger":
        return sum(s.end - s.start for s in slots if s.lane in ("gpsimd", "dge"))
    return max(s.end for s in slots) - min(s.start for s in slots)


def hardware_constant(target, name):
    """A constant of the model as it stands (for figures that are its source)."""
    from ..constants import hardware
    return getattr(hardware(target), name)


def dependent_scalar_interval(n=32, target="trn1"):
    """Issue interval of ``n`` back-to-back ScalarE activations (identity with scale and bias)
    on one fp32 element per partition, each reading the one before (the guide's profile)."""
    from nki_kernels import simulate
    from nki_kernels.simulate import nisa, nl
    from ..cost_model import estimate

    @simulate.jit
    def chain(x):
        t = nl.ndarray((128, 1), nl.float32, buffer=nl.sbuf, name="t")
        nisa.dma_copy(dst=t, src=x)
        for _ in range(n):
            nisa.activation(dst=t, op=nl.copy, data=t, scale=1.5, bias=None)
        out = nl.ndarray((128, 1), nl.float32, buffer=nl.shared_hbm, name="out")
        nisa.dma_copy(dst=out, src=t)
        return out

    with simulate.use_target(target):
        simulate.simulate(chain)(np.ones((128, 1), np.float32))
    slots = [s for s in estimate(simulate.last_trace()).schedule.slots if s.lane == "scalar"]
    starts = sorted(s.start for s in slots)
    return (starts[-1] - starts[0]) / (len(starts) - 1)


def loop_iteration(iterations=16, target="trn2"):
    """Modelled time per iteration of a device loop whose body is one small VectorE op."""
    from nki_kernels import simulate
    from nki_kernels.simulate import nisa, nl
    from ..cost_model import estimate

    @simulate.jit
    def looped(x, n):
        t = nl.ndarray((128, 1), nl.int32, buffer=nl.sbuf, name="t")
        nisa.dma_copy(dst=t, src=x)
        trips = nisa.scalar_load(t[0:1, 0:1])

        def body(_):
            nisa.tensor_scalar(dst=t, data=t, op0=nl.add, operand0=1)
        nl.fori_loop(0, trips, body)
        out = nl.ndarray((128, 1), nl.int32, buffer=nl.shared_hbm, name="out")
        nisa.dma_copy(dst=out, src=t)
        return out

    times = []
    for n in (iterations, 2 * iterations):
        with simulate.use_target(target):
            simulate.simulate(looped)(np.full((128, 1), n, np.int32), n)
        times.append(estimate(simulate.last_trace()).seconds)
    return (times[1] - times[0]) / iterations


def gemm_seconds(n, target="trn1"):
    """Device time of an n^3 fp32 GEMM kernel (tiles of 128 x 128 x 512, PSUM accumulation,
    loads double-buffered by the schedule), checked against NumPy."""
    from nki_kernels import simulate
    from nki_kernels.simulate import nisa, nl
    from ..cost_model import estimate

    @simulate.jit
    def gemm(aT, b):
        K, M = aT.shape
        N = b.shape[1]
        out = nl.ndarray((M, N), nl.float32, buffer=nl.shared_hbm, name="c")
        for m in range(M // 128):
            for j in range(N // 512):
                acc = nl.ndarray((128, 512), nl.float32, buffer=nl.psum, name="acc")
                for k in range(K // 128):
                    at = nl.ndarray((128, 128), nl.float32, buffer=nl.sbuf, name="at")
                    nisa.dma_copy(dst=at, src=aT[k * 128:(k + 1) * 128, m * 128:(m + 1) * 128])
                    bt = nl.ndarray((128, 512), nl.float32, buffer=nl.sbuf, name="bt")
                    nisa.dma_copy(dst=bt, src=b[k * 128:(k + 1) * 128, j * 512:(j + 1) * 512])
                    nisa.nc_matmul(dst=acc, stationary=at, moving=bt, accumulate=k != 0)
                c = nl.ndarray((128, 512), nl.float32, buffer=nl.sbuf, name="c_sb")
                nisa.tensor_copy(dst=c, src=acc)
                nisa.dma_copy(dst=out[m * 128:(m + 1) * 128, j * 512:(j + 1) * 512], src=c)
        return out

    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n)).astype(np.float32)
    b = rng.standard_normal((n, n)).astype(np.float32)
    with simulate.use_target(target):
        c = simulate.simulate(gemm)(np.ascontiguousarray(a.T), b)
    np.testing.assert_allclose(c, a @ b, rtol=1e-3, atol=1e-2 * np.sqrt(n))
    return estimate(simulate.last_trace()).seconds


def figures(Figure):
    """The measured figures, as ``published.Figure`` rows."""
    return [
        Figure("trn2 A[4, 4096] bf16 load: the one engine busy", "[DMA-OV]", 1416e-9, "s",
               lambda: overview_load(4, 4096), 0.10),
        Figure("trn2 A[128, 128] bf16 load: each engine's 2 KiB", "[DMA-OV]", 97e-9, "s",
               lambda: overview_load(128, 128) , 0.15),
        Figure("trn2 A[128, 128] bf16 software-DGE load: trigger to done", "[DMA-OV]", 1.2e-6,
               "s", lambda: overview_load(128, 128, "swdge", "total"), 0.5),
        Figure("trn2 static DMA: trigger to first data (source of trn2 dma_fixed_s)",
               "[DMA-OV]", 0.9e-6, "s", lambda: hardware_constant("trn2", "dma_fixed_s"), 0.15),
        Figure("trn2 software-DGE trigger on GpSimd (source of swdge_fixed_cycles)", "[DMA-OV]",
               8e-9, "s", lambda: overview_load(128, 128, "swdge", "trigger"), 0.5),
        Figure("trn1 dependent ScalarE activations, 1 element: issue interval", "[PERF]",
               189e-9, "s", lambda: dependent_scalar_interval(), 0.25),
        Figure("trn2 device-loop iteration (source of loop_iteration_s)", "[LIB]", 9e-6, "s",
               lambda: loop_iteration(), 0.25),
        Figure("trn1 GEMM 512^3 per call through torch (host dispatch included)", "[TRNSCI]",
               1.3e-3, "s", lambda: gemm_seconds(512), 0.25, reproduced=False),
        Figure("trn1 GEMM 1024^3 per call through torch (host dispatch included)", "[TRNSCI]",
               2.3e-3, "s", lambda: gemm_seconds(1024), 0.25, reproduced=False),
    ]
