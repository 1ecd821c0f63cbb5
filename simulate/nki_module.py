"""Stand in for the ``nki`` package: ``import nki`` then finds this simulator.

``install()`` puts module objects named ``nki``, ``nki.language``, ``nki.isa`` (a package with
``nki.isa.constants``), ``nki.collectives``, ``nki.simulator``, ``nki.typing`` and
``nki.compiler.kernel_builder`` into ``sys.modules`` so kernels
written for NKI Beta 2 run unchanged; ``uninstall()`` restores what was there; ``patched()`` does
both around a block.
"""

from __future__ import annotations

import contextlib
import sys
import types

_NAMES = ("nki", "nki.language", "nki.isa", "nki.isa.constants", "nki.collectives",
          "nki.simulator", "nki.typing", "nki.compiler", "nki.compiler.kernel_builder")
_saved = None


def build_modules() -> dict:
    """Fresh ``nki*`` module objects backed by the simulator."""
    from . import collectives, isa, kernel_builder, language
    from .isa import constants
    from .launch import jit, simulate, simulate_kernel
    from .errors import NkiValidationError

    def module(name, doc, source=None, package=False):
        m = types.ModuleType(name, doc)
        if source is not None:
            m.__dict__.update({k: v for k, v in vars(source).items() if not k.startswith("__")})
        if package:
            m.__path__ = []
        return m

    nki = module("nki", "NKI Beta 2 API simulated in NumPy (nki-kernels `simulate`).", package=True)
    nl = module("nki.language", "nki.language (simulated)", language)
    nisa = module("nki.isa", "nki.isa (simulated)", isa, package=True)
    nisa_constants = module("nki.isa.constants", "nki.isa.constants (simulated)", constants)
    nisa.constants = nisa_constants
    ncc = module("nki.collectives", "nki.collectives (simulated)", collectives)
    simulator = module("nki.simulator", "vllm-neuron's entry: simulate_kernel(func, args, kwargs)")
    simulator.simulate_kernel = simulate_kernel
    # nki.typing: ``tensor``, the annotation the language guide and the average-pool tutorial
    # give kernel parameters (``def kernel(x: tensor)``), is the tensor class
    typing_module = module("nki.typing", "nki.typing (simulated): kernel parameter annotations")
    typing_module.tensor = language.ndarray
    compiler = module("nki.compiler", "nki.compiler (simulated)", package=True)
    builder = module("nki.compiler.kernel_builder", "nki.compiler.kernel_builder (simulated)")
    builder.compile_kernel = kernel_builder.compile_kernel
    compiler.kernel_builder = builder
    nki.__dict__.update(language=nl, isa=nisa, collectives=ncc, simulator=simulator, jit=jit,
                        typing=typing_module, compiler=compiler,
                        simulate=simulate, dtype=language.dtype,
                        NkiValidationError=NkiValidationError, __nki_kernels_simulator__=True)
    return {"nki": nki, "nki.language": nl, "nki.isa": nisa, "nki.isa.constants": nisa_constants,
            "nki.collectives": ncc, "nki.simulator": simulator, "nki.typing": typing_module,
            "nki.compiler": compiler, "nki.compiler.kernel_builder": builder}


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
