"""Which Neuron SDK releases and instances the device path can use, said before anything runs.

- The kernels are NKI Beta 2 (``import nki``, Neuron 2.27+) and use compiled device loops
  (``nl.fori_loop``), which arrived in NKI 0.6.0 (Neuron 2.32): older releases cannot compile
  them.
- Trainium1 (NeuronCore-v2): NKI Beta 2 runs there up to Neuron 2.28; the FAQ from 2.29 lists
  Trainium2 and Trainium3 only. No release has both, so the trn1 paths run in the simulator and
  the cost model only.
"""

from __future__ import annotations

MIN_NKI = (0, 6, 0)
MIN_NKI_RELEASE = "Neuron 2.32"
LAST_TRN1_RELEASE = "Neuron 2.28"


def version_tuple(text) -> tuple:
    parts = []
    for piece in str(text).split(".")[:3]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts + [0] * (3 - len(parts)))


def sdk_problem(backend: str, module, target: str):
    """One line saying why the device path cannot run here, or None."""
    if backend == "rehearsal":
        return None
    if target == "trn1":
        return (f"trn1: no Neuron release runs these kernels on Trainium1 (NKI Beta 2 supports it "
                f"up to {LAST_TRN1_RELEASE}; the kernels' nl.fori_loop needs NKI "
                f"{'.'.join(map(str, MIN_NKI))}, {MIN_NKI_RELEASE}); use --target trn2 on a "
                f"trn2 instance, or the simulator")
    found = getattr(module, "__version__", None)
    if found is not None and version_tuple(found) < MIN_NKI:
        return (f"nki {found} is too old: the kernels use nl.fori_loop (NKI "
                f"{'.'.join(map(str, MIN_NKI))}, {MIN_NKI_RELEASE} or later)")
    return None


def rehearsal_note(backend: str, target: str):
    """What a rehearsal of ``target`` does not show (or None)."""
    if backend == "rehearsal" and target == "trn1":
        return ("note: rehearsing trn1; on hardware no Neuron release runs these kernels on "
                "Trainium1 (see nki_kernels/device/sdk.py)")
    return None
