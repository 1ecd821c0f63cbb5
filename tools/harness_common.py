"""What the third-party harnesses share: importing a source file by path, comparing outputs
(nested tuples of arrays) within tolerances, and a case's verdict line."""

from __future__ import annotations

import importlib.util
import os
import sys
import traceback

import numpy as np


def load_file(root, path, prefix, with_folder=False):
    """Import ``root/path`` as a module of its own (its folder first on sys.path while it loads,
    for sibling imports, with ``with_folder``)."""
    full = os.path.join(root, path)
    folder = os.path.dirname(full)
    if with_folder:
        sys.path.insert(0, folder)
    try:
        name = prefix + path.replace("/", "_").replace("-", "_").replace(".", "_")
        spec = importlib.util.spec_from_file_location(name, full)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        if with_folder:
            sys.path.remove(folder)


def compare(got, want, atol, rtol):
    """Assert ``got`` equals ``want`` (arrays, or tuples of them) within the tolerances."""
    if isinstance(want, tuple):
        assert isinstance(got, (tuple, list)) and len(got) == len(want), \
            f"{len(got) if isinstance(got, (tuple, list)) else 1} outputs, expected {len(want)}"
        for g, w in zip(got, want):
            compare(g, w, atol, rtol)
        return
    np.testing.assert_allclose(np.asarray(got, np.float64).reshape(np.shape(want)),
                               np.asarray(want, np.float64), atol=atol, rtol=rtol)


def verdict(run, atol, rtol, refused=None):
    """("matched" | "refused as documented" | "error" | "mismatch" | "not refused", detail) of
    ``run()`` -> (got, want); ``refused``: a part of the SimulationError expected instead."""
    from nki_kernels import simulate
    try:
        got, want = run()
    except simulate.SimulationError as err:
        if refused and refused in str(err):
            return "refused as documented", str(err).splitlines()[0][:160]
        return "error", f"{type(err).__name__}: {str(err).splitlines()[0][:200]}"
    except Exception as err:                              # noqa: BLE001 - reported per case
        return "error", f"{type(err).__name__}: {err}"[:200] + "\n" + traceback.format_exc(
            limit=-3)
    if refused:
        return "not refused", "expected a refusal"
    try:
        compare(got, want, atol, rtol)
    except AssertionError as err:
        return "mismatch", str(err).strip().splitlines()[-1][:200]
    return "matched", ""
