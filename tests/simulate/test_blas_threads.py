"""A launch runs NumPy's OpenBLAS on one thread (tile-sized matmuls are faster unsplit) and gives
the caller's thread count back afterwards, also when the kernel raises or launches nest."""

import numpy as np
import pytest

from nki_kernels import simulate
from nki_kernels.simulate import blas_threads, jit, nisa, nl

CONTROLS = blas_threads.controls()
pytestmark = pytest.mark.skipif(not CONTROLS, reason="NumPy's BLAS here is not a loaded OpenBLAS")

seen = []


def blas_pool():
    return [pair[0]() for pair in CONTROLS]


@jit
def copy_and_look(x):
    out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
    t = nl.ndarray(x.shape, x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    seen.append(blas_pool())
    nisa.dma_copy(dst=out, src=t)
    return out


@jit
def fails_midway(x):
    seen.append(blas_pool())
    t = nl.ndarray((200, 4), x.dtype, buffer=nl.sbuf)     # 200 partitions: refused
    nisa.dma_copy(dst=t, src=x)
    return t


@pytest.fixture
def two_threads():
    """The pool at two threads for the test (the machine may have been set to one)."""
    before = blas_pool()
    for _, put in CONTROLS:
        put(2)
    seen.clear()
    yield
    for (_, put), n in zip(CONTROLS, before):
        put(n)


def test_one_thread_inside_a_launch_and_restored_after(two_threads):
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    assert np.array_equal(copy_and_look(x), x)
    assert seen == [[1] * len(CONTROLS)]
    assert blas_pool() == [2] * len(CONTROLS)


def test_restored_when_the_kernel_raises(two_threads):
    with pytest.raises(simulate.SimulationError):
        fails_midway(np.zeros((200, 4), np.float32))
    assert seen == [[1] * len(CONTROLS)]
    assert blas_pool() == [2] * len(CONTROLS)


def test_nested_blocks_restore_only_at_the_outermost(two_threads):
    with blas_threads.one_blas_thread():
        with blas_threads.one_blas_thread():
            assert blas_pool() == [1] * len(CONTROLS)
        assert blas_pool() == [1] * len(CONTROLS)
    assert blas_pool() == [2] * len(CONTROLS)


def test_keep_leaves_the_pool_alone(two_threads, monkeypatch):
    monkeypatch.setenv("NKI_SIM_BLAS_THREADS", "keep")
    copy_and_look(np.zeros((2, 4), np.float32))
    assert seen == [[2] * len(CONTROLS)]
