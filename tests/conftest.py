"""Shared fixtures: seeded randomness, simulator targets, and the device switch.

``--device=sim`` (default) runs kernels in the NumPy simulator; ``--device=trn`` runs them through
the real ``nki`` on a Trainium instance (or its rehearsal, ``NKI_KERNELS_REHEARSE=1``): tests
marked ``sim_only`` or in the simulator's and cost model's folders are skipped, kernel tests run
for the device's generation only (``NKI_KERNELS_DEVICE_TARGET``, default trn2), and reading the
simulator's own state (traces, compile counts) fails the test: on a device there is none.
"""

import zlib

import numpy as np
import pytest

from nki_kernels import simulate

SIM_TARGETS = ("trn1", "trn2")


def pytest_addoption(parser):
    parser.addoption("--device", default="sim", choices=("sim", "trn"),
                     help="sim: NumPy simulator (default); trn: real NKI on Trainium")


def device_target():
    import os
    return os.environ.get("NKI_KERNELS_DEVICE_TARGET",
                          os.environ.get("NKI_KERNELS_REHEARSE_TARGET", "trn2"))


SIMULATOR_STATE = ("tracing", "compile_stats", "compile_keys", "reset_compile_stats")


def _no_simulator_state(name):
    def refuse(*args, **kwargs):
        raise RuntimeError(f"simulate.{name}: simulator-only state read in a --device=trn run "
                           f"(there is none on a device); mark the test sim_only")
    return refuse


def pytest_configure(config):
    config.addinivalue_line("markers", "sim_only: relies on simulator internals (trace, errors)")
    if config.getoption("--device") == "trn":
        import os
        os.environ["NKI_KERNELS_BACKEND"] = "nki"
        for name in SIMULATOR_STATE:
            setattr(simulate, name, _no_simulator_state(name))


# Test folders about the simulator and the cost model themselves (no kernel on a device)
SIM_ONLY_DIRS = ("simulate", "profile")


def pytest_collection_modifyitems(config, items):
    if config.getoption("--device") == "trn":
        skip = pytest.mark.skip(reason="simulator-only test")
        other = pytest.mark.skip(reason="another NeuronCore generation than the device's")
        for item in items:
            folder = item.path.parent.name
            if "sim_only" in item.keywords or folder in SIM_ONLY_DIRS:
                item.add_marker(skip)
            callspec = getattr(item, "callspec", None)
            if callspec is not None and callspec.params.get("target", device_target()) \
                    != device_target():
                item.add_marker(other)


@pytest.fixture
def rng(request):
    """A NumPy generator seeded from the test's name: reproducible and distinct per test."""
    seed = zlib.crc32(request.node.nodeid.encode())
    return np.random.default_rng(seed)


@pytest.fixture(params=SIM_TARGETS)
def target(request):
    """Run the test once per simulated NeuronCore generation (trn1: v2, trn2: v3)."""
    with simulate.use_target(request.param):
        yield request.param


@pytest.fixture
def fresh_subset_checks():
    """The kernels of the test are checked against the NKI subset afresh (the check is cached per
    function and mode, and a result cached before mutmut forks would hide mutants)."""
    from nki_kernels.simulate import subset
    subset._checked.clear()
