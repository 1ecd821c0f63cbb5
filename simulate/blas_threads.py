"""One BLAS thread while a kernel runs.

The simulator's matmuls are tile-sized (at most 128 x 128 x 512). OpenBLAS splits a product
over its thread pool from about 2**18 multiply-adds up, and at tile sizes waking and joining the
pool costs more than the split gains: the decode benchmark (16,384 ``nc_matmul`` of
``[128, 32].T @ [128, 128]``) ran 20% faster with ``OPENBLAS_NUM_THREADS=1`` on a 2-core machine.
So a launch sets OpenBLAS's pool to one thread and restores the caller's setting afterwards.

The library is found among the shared objects this process has loaded (``/proc/self/maps``),
so it is the very OpenBLAS NumPy calls, whichever wheel it came from; elsewhere (macOS, a NumPy
built on another BLAS) nothing is changed. ``NKI_SIM_BLAS_THREADS=keep`` turns it off.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import threading

# OpenBLAS's thread-count entry points as the NumPy wheels build it (scipy-openblas, ILP64 and
# LP64) and as a system OpenBLAS exports it
_SYMBOLS = (("scipy_openblas_get_num_threads64_", "scipy_openblas_set_num_threads64_"),
            ("scipy_openblas_get_num_threads", "scipy_openblas_set_num_threads"),
            ("openblas_get_num_threads64_", "openblas_set_num_threads64_"),
            ("openblas_get_num_threads", "openblas_set_num_threads"))

_lock = threading.Lock()
_depth = 0                 # launches running now (LNC=2 instances and nested launches share one)
_saved = None              # the pool size to restore when the last of them ends
_controls = None           # [(get, set)] per loaded OpenBLAS, found on first use


def _loaded_openblas() -> list:
    """Paths of the OpenBLAS shared objects mapped into this process (Linux; else none)."""
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "openblas" in line.lower()}
    except OSError:
        return []
    return sorted(p for p in paths if p.startswith("/") and ".so" in p)


def _find_controls() -> list:
    found = []
    for path in _loaded_openblas():
        try:
            lib = ctypes.CDLL(path, mode=getattr(os, "RTLD_NOLOAD", 0) | ctypes.RTLD_GLOBAL)
        except OSError:
            continue
        for get_name, set_name in _SYMBOLS:
            get, put = getattr(lib, get_name, None), getattr(lib, set_name, None)
            if get is not None and put is not None:
                get.restype, put.argtypes = ctypes.c_int, [ctypes.c_int]
                found.append((get, put))
                break
    return found


def controls() -> list:
    """The (get, set) thread-count functions of every loaded OpenBLAS (cached)."""
    global _controls
    if _controls is None:             # NumPy (and its BLAS) is loaded by then: launches use it
        _controls = _find_controls()
    return _controls


@contextlib.contextmanager
def one_blas_thread():
    """OpenBLAS on one thread for the ``with`` block; the outermost block restores it."""
    global _depth, _saved
    if os.environ.get("NKI_SIM_BLAS_THREADS", "").lower() == "keep":
        yield
        return
    with _lock:
        if _depth == 0:
            libs = controls()
            _saved = [get() for get, _ in libs]
            for _, put in libs:
                put(1)
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0:
                for (_, put), n in zip(controls(), _saved):
                    put(n)
                _saved = None
