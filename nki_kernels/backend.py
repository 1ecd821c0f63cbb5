"""The one place kernels get ``nki``, ``nl`` and ``nisa`` from.

The real NKI package (Neuron SDK, installed from the Neuron pip repository) is used when it is
importable and genuine; otherwise, or when ``NKI_KERNELS_BACKEND=sim`` or ``NKI_SIMULATOR=1`` (the
official simulator's switch), the NumPy simulator in ``simulate`` stands in. The PyPI ``nki`` placeholder (no ``nki.jit``) counts as absent.

    from nki_kernels.backend import nki, nl, nisa
"""

from __future__ import annotations

import importlib
import os

BACKEND_ENV = "NKI_KERNELS_BACKEND"     # "auto" (default) | "sim" | "nki"


def _real_nki():
    try:
        nki = importlib.import_module("nki")
        importlib.import_module("nki.language")
        importlib.import_module("nki.isa")
    except ImportError:
        return None
    if getattr(nki, "__nki_kernels_simulator__", False) or not hasattr(nki, "jit"):
        return None
    return nki


def _select():
    if os.environ.get("NKI_KERNELS_REHEARSE", "0") not in ("", "0"):
        # the Trainium path rehearsed on a CPU (nki_kernels/device/rehearse.py)
        from nki_kernels import simulate
        from nki_kernels.device.launches import DeviceNki
        from nki_kernels.device.rehearse import benchmark_with
        modules = simulate.build_modules()
        return ("rehearsal", DeviceNki(modules["nki"], benchmark_with(modules["nki"].jit)),
                simulate.nl, simulate.nisa)
    choice = os.environ.get(BACKEND_ENV, "auto").lower()
    if choice not in ("auto", "sim", "nki"):
        raise ValueError(f"{BACKEND_ENV}={choice!r} must be auto, sim or nki")
    if os.environ.get("NKI_SIMULATOR", "0") not in ("", "0") and choice == "auto":
        choice = "sim"
    real = None if choice == "sim" else _real_nki()
    if choice == "nki" and real is None:
        raise ImportError(f"{BACKEND_ENV}=nki but the Neuron SDK's nki package is not installed "
                          f"(the PyPI 'nki' is a placeholder); install it from the Neuron pip "
                          f"repository on a trn/inf instance")
    if real is not None:
        from nki_kernels.device.launches import DeviceNki
        return "nki", DeviceNki(real), real.language, real.isa
    from nki_kernels import simulate
    modules = simulate.build_modules()
    return "sim", modules["nki"], simulate.nl, simulate.nisa


BACKEND, nki, nl, nisa = _select()
ON_HARDWARE = BACKEND == "nki"
ON_DEVICE = BACKEND in ("nki", "rehearsal")     # the device path (real, or rehearsed on a CPU)


def require_hardware(what: str) -> None:
    """Raise a clear error when ``what`` needs the real Neuron stack (or its rehearsal,
    NKI_KERNELS_REHEARSE=1) and it is absent."""
    if not ON_DEVICE:
        raise RuntimeError(f"{what} needs the Neuron SDK (nki, neuronx-cc) on a Trainium/"
                           f"Inferentia instance; it is not installed here (on a CPU: the simulator, or "
                           f"NKI_KERNELS_REHEARSE=1 to rehearse the device path)")
