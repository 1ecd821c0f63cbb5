"""NKI kernels for LLM serving on Trainium: paged KV append, TensorScatter, paged decode attention.

Each kernel runs unchanged on trn hardware (real ``nki``) or on a CPU through ``simulate``.
"""

__version__ = "0.1.0"


def _from_checkout():
    """In a source checkout ``simulate/`` and ``access_patterns/`` sit beside this package (a
    wheel installs them inside it, see pyproject's package-dir): find them there as
    ``nki_kernels.simulate`` and ``nki_kernels.access_patterns``."""
    import importlib.abc
    import importlib.util
    import os
    import sys

    here = os.path.dirname(os.path.abspath(__file__))
    beside = {name: os.path.join(os.path.dirname(here), name)
              for name in ("simulate", "access_patterns")
              if not os.path.isdir(os.path.join(here, name))}
    beside = {name: path for name, path in beside.items()
              if os.path.isfile(os.path.join(path, "__init__.py"))}

    class CheckoutFinder(importlib.abc.MetaPathFinder):
        def find_spec(self, fullname, path=None, target=None):
            package, _, name = fullname.partition(".")
            if package != __name__ or name not in beside:
                return None
            return importlib.util.spec_from_file_location(
                fullname, os.path.join(beside[name], "__init__.py"),
                submodule_search_locations=[beside[name]])

    if beside and not any(type(f).__name__ == "CheckoutFinder" for f in sys.meta_path):
        sys.meta_path.insert(0, CheckoutFinder())


_from_checkout()

