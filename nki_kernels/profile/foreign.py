"""Cost any NKI kernel, not only the registered ones: run it in the simulator on given or
generated arguments and model its trace (``cost_kernel``), from Python or from
``nki-kernels profile path/to/file.py:kernel --arg name=SPEC ...``.

Argument specs: ``128x64:bfloat16`` (a random normal array of that shape and dtype; integer
dtypes hold zeros, ``:arange`` appended numbers the elements), or a plain number (an int or a
float passed as is).
"""

from __future__ import annotations

import importlib.util
import os
import sys

import numpy as np


def parse_arg(spec: str):
    """The value of one ``--arg`` spec (see the module doc); refuses a malformed one by name."""
    if ":" not in spec:
        try:
            return int(spec)
        except ValueError:
            try:
                return float(spec)
            except ValueError:
                raise ValueError(f"--arg value {spec!r}: a number, or SHAPE:DTYPE such as "
                                 f"128x64:bfloat16") from None
    shape_text, dtype_name, *how = spec.split(":")
    try:
        shape = tuple(int(n) for n in shape_text.lower().split("x"))
    except ValueError:
        raise ValueError(f"--arg shape {shape_text!r} must be sizes joined by x, e.g. 128x64") \
            from None
    import ml_dtypes  # noqa: F401  (registers bfloat16 / fp8 names with NumPy)
    dtype = np.dtype(getattr(ml_dtypes, dtype_name, dtype_name))
    if how == ["arange"]:
        return np.arange(int(np.prod(shape))).reshape(shape).astype(dtype)
    if how:
        raise ValueError(f"--arg {spec!r}: the only suffix is :arange")
    if dtype.kind in "iub":
        return np.zeros(shape, dtype)
    return np.random.default_rng(0).standard_normal(shape).astype(dtype)


def load_kernel(path_and_name: str):
    """``path/to/file.py:kernel`` -> the kernel object, the file imported with the simulator
    standing in for ``nki`` (``simulate.patched()``, undone afterwards)."""
    path, _, name = path_and_name.rpartition(":")
    if not path or not os.path.isfile(path):
        raise ValueError(f"{path_and_name!r}: expected path/to/file.py:kernel_name")
    from nki_kernels import simulate
    module_name = f"_costed_{os.path.splitext(os.path.basename(path))[0]}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
    try:
        with simulate.patched():           # its `import nki` binds the simulator's modules
            spec.loader.exec_module(module)
    finally:
        sys.path.pop(0)
    if not hasattr(module, name):
        raise ValueError(f"{path} has no {name!r}")
    return getattr(module, name)


def cost_kernel(kernel, *args, target="trn2", lnc=1, overrides=None, **kwargs):
    """Run ``kernel`` (an ``nki.jit`` kernel or a plain kernel function) on ``args`` /
    ``kwargs`` in the simulator for ``target`` and model every launch: (result, [Estimate]).
    ``overrides``: cost-model constants by name (``profile.constants``)."""
    from nki_kernels import simulate
    from nki_kernels.profile import estimate
    run = simulate.simulate(kernel, target=target)
    if lnc > 1:
        run = run[lnc]
    with simulate.tracing() as traces:
        result = run(*args, **kwargs)
    return result, [estimate(t, target=target, **(overrides or {})) for t in traces]


def report(name, estimates, argument_bytes: int) -> str:
    """The profile of a costed kernel: per launch its instructions, DMAs, HBM bytes and the three
    modelled times, beside the floor of the bytes its arguments hold (the least it must move)."""
    lines = ["| kernel | launch | instr | DMAs | HBM bytes | argument bytes | scheduled us "
             "| lower us | serial us | floor us | scheduled/floor |", "|" + "---|" * 11]
    for i, est in enumerate(estimates):
        floor = argument_bytes / (est.hw.hbm_bytes_per_s * est.cores)
        lines.append(f"| {name} | {i} | {sum(est.instructions.values())} | {est.dma_count} "
                     f"| {est.hbm_bytes} | {argument_bytes} | {est.seconds * 1e6:.1f} "
                     f"| {est.lower_seconds * 1e6:.1f} | {est.serial_seconds * 1e6:.1f} "
                     f"| {floor * 1e6:.2f} | {est.seconds / floor if floor else float('nan'):.1f} |")
    return "\n".join(lines)
