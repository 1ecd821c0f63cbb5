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
        return "nki", real, real.language, real.isa
    from nki_kernels import simulate
    modules = simulate.build_modules()
    return "sim", modules["nki"], simulate.nl, simulate.nisa


BACKEND, nki, nl, nisa = _select()
ON_HARDWARE = BACKEND == "nki"


def require_hardware(what: str) -> None:
    """Raise a clear error when ``what`` needs the real Neuron stack and it is absent."""
    if not ON_HARDWARE:
        raise RuntimeError(f"{what} needs the Neuron SDK (nki, neuronx-cc) on a Trainium/"
                           f"Inferentia instance; it is not installed here. On a CPU, use the "
                           f"simulator path.")
