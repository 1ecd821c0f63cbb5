"""The scripts under benchmarks/ loaded as modules for their tests."""

import importlib.util
import pathlib

BENCHMARKS = pathlib.Path(__file__).resolve().parents[2] / "benchmarks"


def load(name: str):
    """benchmarks/<name>.py as a fresh module."""
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
