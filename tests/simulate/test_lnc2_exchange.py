"""LNC=2: the two program instances run concurrently and really meet at sendrecv / core_barrier;
a partner that never arrives is an error naming the line, not a hang."""

import numpy as np
import pytest

from nki_kernels import simulate
from nki_kernels.simulate import jit, nisa, nl
from nki_kernels.simulate.lnc import SynchronizationError


@jit
def swap_halves(x):
    """Each core loads its half, swaps it with the other core through sendrecv, writes it back."""
    n = x.shape[0] // 2
    me = nl.program_id(0)
    mine = nl.ndarray((n, x.shape[1]), x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=mine, src=x[me * n:(me + 1) * n, :])
    theirs = nl.ndarray((n, x.shape[1]), x.dtype, buffer=nl.sbuf)
    nisa.sendrecv(src=mine, dst=theirs, send_to_rank=1 - me, recv_from_rank=1 - me, pipe_id=0)
    out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out[me * n:(me + 1) * n, :], src=theirs)
    return out


def test_sendrecv_swaps_between_cores():
    x = np.arange(24, dtype=np.float32).reshape(8, 3)
    out = swap_halves[2](x)
    np.testing.assert_array_equal(out, np.concatenate([x[4:], x[:4]]))
    assert [e.op for e in simulate.last_trace()].count("sendrecv") == 2


def test_sendrecv_needs_lnc2_and_trn2():
    x = np.zeros((8, 3), np.float32)
    with pytest.raises(simulate.ValidationError, match="needs an LNC=2 launch"):
        swap_halves(x)
    with pytest.raises(simulate.TargetError, match="NeuronCore-v3"):
        simulate.simulate(swap_halves[2], target="trn1")(x)


def test_core_barrier_orders_writes_of_the_other_core():
    @jit
    def k(x):
        me = nl.program_id(0)
        shared = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
        t = nl.ndarray((1, x.shape[1]), x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x[me:me + 1, :])
        nisa.dma_copy(dst=shared[me:me + 1, :], src=t)
        nisa.core_barrier(data=shared, cores=(0, 1))
        other = nl.ndarray((1, x.shape[1]), x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=other, src=shared[1 - me:2 - me, :])     # the other core's row
        out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out[me:me + 1, :], src=other)
        return out
    x = np.array([[1, 2], [3, 4]], np.float32)
    np.testing.assert_array_equal(k[2](x), x[::-1])


def test_missing_partner_is_an_error_not_a_hang():
    @jit
    def k(x):
        shared = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
        if nl.program_id(0) == 0:
            nisa.core_barrier(data=shared, cores=(0, 1))
        return shared
    with pytest.raises(SynchronizationError, match=r"program \(1,\), which finished without "
                                                   r"reaching the matching core_barrier"):
        k[2](np.zeros((2, 2), np.float32))


def test_error_in_one_core_is_reported_not_the_partners_wait():
    @jit
    def k(x):
        shared = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
        if nl.program_id(0) == 1:
            nisa.memset(dst=shared, value=0.0)            # memset cannot write HBM
        nisa.core_barrier(data=shared, cores=(0, 1))
        return shared
    with pytest.raises(simulate.ValidationError) as err:
        k[2](np.zeros((2, 2), np.float32))
    assert not isinstance(err.value, SynchronizationError) and "memset" in str(err.value)


@pytest.mark.parametrize("grid", [(4, 2), 3, 0, (2, 1), "2"])
def test_beta1_grids_are_refused(grid):
    with pytest.raises(ValueError, match="Beta 2 takes kernel\\[lnc\\] with lnc 1 or 2"):
        swap_halves[grid]


def test_lnc1_bracket_is_a_single_instance():
    x = np.zeros((8, 3), np.float32)
    with pytest.raises(simulate.ValidationError, match="needs an LNC=2 launch"):
        swap_halves[1](x)
