"""Shared fixtures: seeded randomness, simulator targets, and the device switch.

``--device=sim`` (default) runs kernels in the NumPy simulator; ``--device=trn`` runs them through
the real ``nki`` on a Trainium instance (tests marked ``sim_only`` are skipped there).
"""

import zlib

import numpy as np
import pytest

from nki_kernels import simulate

SIM_TARGETS = ("trn1", "trn2")


def pytest_addoption(parser):
    parser.addoption("--device", default="sim", choices=("sim", "trn"),
                     help="sim: NumPy simulator (default); trn: real NKI on Trainium")


def pytest_configure(config):
    config.addinivalue_line("markers", "sim_only: relies on simulator internals (trace, errors)")
    if config.getoption("--device") == "trn":
        import os
        os.environ["NKI_KERNELS_BACKEND"] = "nki"


# Test folders about the simulator and the cost model themselves (no kernel on a device)
SIM_ONLY_DIRS = ("simulate", "profile")


def pytest_collection_modifyitems(config, items):
    if config.getoption("--device") == "trn":
        skip = pytest.mark.skip(reason="simulator-only test")
        for item in items:
            folder = item.path.parent.name
            if "sim_only" in item.keywords or folder in SIM_ONLY_DIRS:
                item.add_marker(skip)


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
