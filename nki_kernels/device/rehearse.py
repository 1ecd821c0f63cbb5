"""A rehearsal of the Trainium path on a CPU (``NKI_KERNELS_REHEARSE=1``): the simulator stands
in for the Neuron SDK, and ``nki.benchmark``'s stand-in reports as "measured" latency the cost
model's estimate under constants the fit does not see:

    NKI_KERNELS_REHEARSE=1 NKI_KERNELS_REHEARSE_CONSTANTS=swdge_cycles_per_descriptor=3,loop_iteration_s=4e-6 \\
        nki-kernels bench --device trn --quick --out /tmp/trn

Kernels go through the same calls as on hardware (``nki.jit``, ``nki.benchmark(warmup=, iters=,
save_neff_name=, save_trace_name=)``, ``benchmark_result.nc_latency.get_latency_percentile``,
files written), so ``calibrate --fit`` must recover those constants from the files alone.
``NKI_KERNELS_REHEARSE_TARGET`` (trn1 | trn2, default trn2) is the instance rehearsed.
"""

from __future__ import annotations

import json
import os

REHEARSE_ENV = "NKI_KERNELS_REHEARSE"
CONSTANTS_ENV = "NKI_KERNELS_REHEARSE_CONSTANTS"
TARGET_ENV = "NKI_KERNELS_REHEARSE_TARGET"


def rehearsing() -> bool:
    return os.environ.get(REHEARSE_ENV, "0") not in ("", "0")


def rehearsal_target() -> str:
    target = os.environ.get(TARGET_ENV, "trn2")
    if target not in ("trn1", "trn2"):
        raise ValueError(f"{TARGET_ENV}={target!r} must be trn1 or trn2")
    return target


def hidden_constants() -> dict:
    """The constants the rehearsal's "device" runs under (name=value,...), as numbers."""
    from nki_kernels.profile.constants import Hardware
    known = {f for f in Hardware.__dataclass_fields__}
    out = {}
    for pair in filter(None, os.environ.get(CONSTANTS_ENV, "").split(",")):
        name, _, value = pair.partition("=")
        name = name.strip()
        if name not in known:
            raise ValueError(f"{CONSTANTS_ENV}: unknown constant {name!r}; known: {sorted(known)}")
        number = float(value)
        out[name] = int(number) if isinstance(getattr(_default(), name), int) else number
    return out


def _default():
    from nki_kernels.profile.constants import hardware
    return hardware(rehearsal_target())


class _Latency:
    def __init__(self, us):
        self._us = us

    def get_latency_percentile(self, percentile):
        """Microseconds (the SDK's unit); the rehearsal's device has no jitter."""
        return self._us


class _Result:
    def __init__(self, us):
        self.nc_latency = _Latency(us)


class _Benchmarked:
    """``nki.benchmark(...)(kernel)``: calling it runs the kernel once in the simulator and
    prices the launch under the hidden constants."""

    def __init__(self, jit, kernel, warmup, iters, save_neff_name, save_trace_name):
        self.jit, self.kernel, self.warmup, self.iters = jit, kernel, warmup, iters
        self.neff, self.ntff = save_neff_name, save_trace_name
        self.benchmark_result = None

    def __call__(self, *args, **kwargs):
        from nki_kernels import simulate
        from nki_kernels.profile import estimate
        target = rehearsal_target()
        hidden = hidden_constants()
        compiled = self.jit(self.kernel)             # as the SDK's benchmark compiles it
        with simulate.use_target(target), simulate.tracing() as traces:
            out = compiled(*args, **kwargs)
        seconds = sum(estimate(t, target=target, **hidden).seconds for t in traces)
        us = seconds * 1e6
        self.benchmark_result = _Result(us)
        for path, what in ((self.neff, "neff"), (self.ntff, "ntff")):
            if path:
                with open(path, "w") as f:
                    json.dump({"rehearsal": what, "latency_us": us, "warmup": self.warmup,
                               "iters": self.iters, "instructions": sum(len(t) for t in traces)},
                              f)
        return out


def benchmark_with(jit):
    """The rehearsal's ``nki.benchmark`` (decorator, with or without arguments), compiling with
    ``jit`` (the simulator's)."""
    def benchmark(kernel=None, warmup=10, iters=100, save_neff_name=None, save_trace_name=None,
                  **_):
        def wrap(k):
            return _Benchmarked(jit, k, warmup, iters, save_neff_name, save_trace_name)
        return wrap(kernel) if kernel is not None else wrap
    return benchmark
