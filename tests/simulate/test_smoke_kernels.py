"""Hand-written NKI kernels run in the simulator: a tiled copy with .ap and an indirect gather."""

import numpy as np
import pytest

from nki_kernels import simulate
from nki_kernels.simulate import jit, nisa, nl


@jit
def tiled_copy(x):
    """x [P, F] @ HBM -> copy through SBUF in column tiles of 64 (last tile partial)."""
    P, F = x.shape
    out = nl.ndarray((P, F), x.dtype, buffer=nl.shared_hbm, name="out")
    for t in range(0, F, 64):
        w = min(64, F - t)
        x_sb = nl.ndarray((P, w), x.dtype, buffer=nl.sbuf, name="x_sb")
        nisa.dma_copy(dst=x_sb, src=x.ap([[F, P], [1, w]], offset=t))
        nisa.dma_copy(dst=out.ap([[F, P], [1, w]], offset=t), src=x_sb)
    return out


@jit
def gather_rows(table, idx):
    """table [R, F] @ HBM, idx [P, 1] int32 -> table[idx[:, 0]] via one indirect DMA."""
    F, P = table.shape[1], idx.shape[0]
    idx_sb = nl.ndarray((P, 1), nl.int32, buffer=nl.sbuf, name="idx_sb")
    nisa.dma_copy(dst=idx_sb, src=idx)
    rows = nl.ndarray((P, F), table.dtype, buffer=nl.sbuf, name="rows")
    nisa.dma_copy(dst=rows, src=table.ap([[F, P], [1, F]], vector_offset=idx_sb, indirect_dim=0),
                  oob_mode=nisa.oob_mode.skip)
    out = nl.ndarray((P, F), table.dtype, buffer=nl.shared_hbm, name="out")
    nisa.dma_copy(dst=out, src=rows)
    return out


@pytest.mark.parametrize("shape", [(1, 1), (128, 200), (37, 129)])
def test_tiled_copy(rng, target, shape):
    x = rng.standard_normal(shape).astype(np.float32)
    np.testing.assert_array_equal(tiled_copy(x), x)
    trace = simulate.last_trace()
    assert trace.hbm_bytes == 2 * x.nbytes
    assert trace.count_by_op()["dma_copy"] == 2 * -(-shape[1] // 64)


def test_gather_rows_and_skip(rng):
    table = rng.standard_normal((50, 8)).astype(np.float32)
    idx = np.array([[3], [0], [49], [7]], np.int32)
    np.testing.assert_array_equal(gather_rows(table, idx), table[idx[:, 0]])
    idx[2, 0] = 50                                   # out of range: row skipped, stays unwritten
    out = gather_rows(table, idx)
    np.testing.assert_array_equal(out[[0, 1, 3]], table[[3, 0, 7]])
    assert np.isnan(out[2]).all()


def test_gather_refused_on_trn1():
    table = np.zeros((4, 2), np.float32)
    with pytest.raises(simulate.TargetError, match="NeuronCore-v3"):
        simulate.simulate(gather_rows, target="trn1")(table, np.zeros((1, 1), np.int32))


def test_out_of_bounds_names_op_operand_program_and_line():
    @jit
    def bad(x):
        t = nl.ndarray((2, 4), x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x.ap([[4, 2], [1, 4]], offset=1))
    with pytest.raises(simulate.OutOfBoundsError,
                       match=r"dma_copy\(src=x\): .*reaches flat index 8, tensor has 8 elements "
                             r"\(program_id=\(0,\), test_smoke_kernels.py:\d+\)"):
        bad(np.zeros((2, 4), np.float32))


def test_sbuf_capacity(target):
    @jit
    def hog(x):
        keep = []
        for _ in range(100):
            keep.append(nl.ndarray((128, 1024), nl.float32, buffer=nl.sbuf))   # 4 KiB/partition each
            nisa.memset(dst=keep[-1], value=0.0)
        for t in keep:                                    # all live until here
            nisa.tensor_copy(dst=keep[0][:, 0:1], src=t[:, 0:1])
    with pytest.raises(simulate.CapacityError, match="SBUF over capacity"):
        hog(np.zeros((1, 1), np.float32))
