"""Stand in for the ``nki`` package: ``import nki`` then finds this simulator.

``install()`` puts module objects named ``nki``, ``nki.language`` and ``nki.isa`` into
``sys.modules`` so kernels written for NKI Beta 2 run unchanged; ``uninstall()`` restores what was
there; ``patched()`` does both around a block.
"""

from __future__ import annotations

import contextlib
import sys
import types

_NAMES = ("nki", "nki.language", "nki.isa")
_saved = None


def build_modules() -> dict:
    """Fresh ``nki``, ``nki.language`` and ``nki.isa`` module objects backed by the simulator."""
    from . import isa, language
    from .launch import jit, simulate
    from .errors import NkiValidationError

    nki = types.ModuleType("nki", "NKI Beta 2 API simulated in NumPy (nki-kernels `simulate`).")
    nl = types.ModuleType("nki.language")
    nisa = types.ModuleType("nki.isa")
    nl.__dict__.update({k: v for k, v in vars(language).items() if not k.startswith("__")})
    nisa.__dict__.update({k: v for k, v in vars(isa).items() if not k.startswith("__")})
    nki.__dict__.update(language=nl, isa=nisa, jit=jit, simulate=simulate,
                        NkiValidationError=NkiValidationError, __path__=[],
                        __nki_kernels_simulator__=True)
    return {"nki": nki, "nki.language": nl, "nki.isa": nisa}


def install() -> None:
    """Make ``import nki`` (and ``nki.language``, ``nki.isa``) resolve to the simulator."""
    global _saved
    if _saved is None:
        _saved = {name: sys.modules.get(name) for name in _NAMES}
    sys.modules.update(build_modules())


def uninstall() -> None:
    """Restore the modules that were importable as ``nki*`` before ``install()``."""
    global _saved
    if _saved is None:
        return
    for name, module in _saved.items():
        if module is None:
            sys.modules.pop(name, None)
        else:
            sys.modules[name] = module
    _saved = None


@contextlib.contextmanager
def patched():
    """``with patched(): import nki ...``: the simulator stands in for ``nki`` inside the block."""
    install()
    try:
        yield sys.modules["nki"]
    finally:
        uninstall()
