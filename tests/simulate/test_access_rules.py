"""Operand resolution rules of the simulator (simulate/access.py) that the kernels' own tests do
not reach: index tiles of the documented shape only, negative steps inside an indirect row,
rows skipped on either side of a DMA, and PSUM accumulation ended by a write of another
engine."""

import ml_dtypes
import numpy as np
import pytest

from nki_kernels import simulate
from nki_kernels.simulate import jit, nisa, nl


@jit
def gather_rows(t, idx, inner, offset):
    """Rows idx[p] of t (row = prod(t.shape[1:]) elements), each read with ``inner`` pairs from
    ``offset``: an [P, prod(inner nums)] result."""
    P, W = idx.shape
    idx_sb = nl.ndarray((P, W), nl.int32, buffer=nl.sbuf)
    nisa.dma_copy(dst=idx_sb, src=idx)
    n = int(np.prod([pair[1] for pair in inner]))
    out_sb = nl.ndarray((P, n), t.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=out_sb, src=t.ap([[1, P]] + [list(p) for p in inner], offset=offset,
                                       vector_offset=idx_sb, indirect_dim=0))
    out = nl.ndarray((P, n), t.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=out_sb)
    return out


def test_vector_offset_must_be_one_index_per_partition():
    """A [P, 2] index tile has no documented meaning for dma_copy: refused by name, not
    silently read as its first column."""
    t = np.arange(40, dtype=np.float32).reshape(10, 4)
    with pytest.raises(simulate.ValidationError, match=r"\[P, 1\] tile .* got shape \(2, 2\)") as info:
        gather_rows(t, np.array([[1, 5], [2, 6]], np.int32), ((1, 4),), 0)
    assert (info.value.op, info.value.operand) == ("dma_copy", "vector_offset")
    got = gather_rows(t, np.array([[1], [2]], np.int32), ((1, 4),), 0)
    np.testing.assert_array_equal(got, t[[1, 2]])


def test_negative_steps_inside_an_indirect_row():
    """A row read backwards from its last element is exact; reaching below element 0 of the
    tensor is out of bounds (not NumPy's wrap to the end)."""
    t = np.arange(40, dtype=np.float32).reshape(10, 4)
    got = gather_rows(t, np.array([[0], [3]], np.int32), ((-1, 4),), 3)
    np.testing.assert_array_equal(got, t[[0, 3], ::-1])
    with pytest.raises(simulate.OutOfBoundsError, match=r"vector_offset row 0 = 0 reaches flat "
                                                         r"indices \[-1, 2\]") as info:
        gather_rows(t, np.array([[0], [3]], np.int32), ((-1, 4),), 2)
    assert (info.value.op, info.value.operand.split("=")[0]) == ("dma_copy", "src")


@jit
def scatter_blocks(table, values, idx):
    """table rows idx[p] get values[p] laid out [2, 3] inside the row (a 3-D indirect
    destination: two runs of 3 elements, 3 apart)."""
    P = idx.shape[0]
    idx_sb = nl.ndarray((P, 1), nl.int32, buffer=nl.sbuf)
    nisa.dma_copy(dst=idx_sb, src=idx)
    v_sb = nl.ndarray((P, 2, 3), values.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=v_sb, src=values)
    nisa.dma_copy(dst=table.ap([[9, P], [4, 2], [1, 3]], offset=1, vector_offset=idx_sb,
                               indirect_dim=0), src=v_sb)
    return table


def test_an_indirect_destination_of_three_dims():
    table = np.zeros((5, 9), np.float32)
    values = np.arange(2 * 6, dtype=np.float32).reshape(2, 2, 3) + 1
    scatter_blocks(table, values, np.array([[4], [1]], np.int32))
    want = np.zeros((5, 9), np.float32)
    for row, v in zip((4, 1), values):
        want[row, 1:4], want[row, 5:8] = v[0], v[1]
    np.testing.assert_array_equal(table, want)


def test_a_scalar_offset_given_as_an_integer():
    @jit
    def row_of(t, row):
        out = nl.ndarray((1, 4), t.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=t.ap([[4, 1], [1, 4]], offset=0, scalar_offset=row,
                                        indirect_dim=0))
        return out

    t = np.arange(40, dtype=np.float32).reshape(10, 4)
    np.testing.assert_array_equal(row_of(t, 7), t[7:8])


@jit
def copy_rows_skipping(src, dst, src_idx, dst_idx):
    """dst rows dst_idx[p] = src rows src_idx[p], HBM to HBM, out-of-bounds rows skipped on
    either side."""
    P = src_idx.shape[0]
    W = src.shape[1]
    s_sb = nl.ndarray((P, 1), nl.int32, buffer=nl.sbuf)
    d_sb = nl.ndarray((P, 1), nl.int32, buffer=nl.sbuf)
    nisa.dma_copy(dst=s_sb, src=src_idx)
    nisa.dma_copy(dst=d_sb, src=dst_idx)
    nisa.dma_copy(dst=dst.ap([[W, P], [1, W]], offset=0, vector_offset=d_sb, indirect_dim=0),
                  src=src.ap([[W, P], [1, W]], offset=0, vector_offset=s_sb, indirect_dim=0),
                  oob_mode=nisa.oob_mode.skip)
    return dst


def test_rows_skipped_on_either_side_are_not_written():
    src = np.arange(5 * 3, dtype=np.float32).reshape(5, 3) + 1
    dst = np.full((6, 3), -1.0, np.float32)
    src_idx = np.array([[0], [99], [2], [4]], np.int32)      # row 1: source out of bounds
    dst_idx = np.array([[5], [1], [77], [3]], np.int32)      # row 2: destination out of bounds
    copy_rows_skipping(src, dst, src_idx, dst_idx)
    want = np.full((6, 3), -1.0, np.float32)
    want[5], want[3] = src[0], src[4]
    np.testing.assert_array_equal(dst, want)


@jit
def copy_row_skipping(src, dst, row_src, row_dst):
    """dst row row_dst[0] = src row row_src[0] by scalar offsets, HBM to HBM, skipped when
    either is out of bounds."""
    W = src.shape[1]
    r = nl.ndarray((1, 2), nl.int32, buffer=nl.sbuf)
    nisa.dma_copy(dst=r[:, 0:1], src=row_src)
    nisa.dma_copy(dst=r[:, 1:2], src=row_dst)
    nisa.dma_copy(dst=dst.ap([[W, 1], [1, W]], offset=0, scalar_offset=r[0:1, 1:2], indirect_dim=0),
                  src=src.ap([[W, 1], [1, W]], offset=0, scalar_offset=r[0:1, 0:1], indirect_dim=0),
                  oob_mode=nisa.oob_mode.skip)
    return dst


@pytest.mark.parametrize("row_src, row_dst, written", [(1, 2, True), (5, 2, False), (1, 6, False)])
def test_a_scalar_offset_out_of_bounds_under_skip_moves_nothing(row_src, row_dst, written):
    """Either side's scalar offset out of bounds: the destination is untouched (not zeros)."""
    src = np.arange(5 * 3, dtype=np.float32).reshape(5, 3) + 1
    dst = np.full((6, 3), -1.0, np.float32)
    copy_row_skipping(src, dst, np.array([[row_src]], np.int32), np.array([[row_dst]], np.int32))
    want = np.full((6, 3), -1.0, np.float32)
    if written:
        want[row_dst] = src[row_src]
    np.testing.assert_array_equal(dst, want)


@jit
def transpose_rows_skipping(src, row):
    """dst [4, 2] (SBUF, preset to -1) = src rows row..row+2 [2, 4] transposed by dma_transpose,
    the source placed by a scalar offset, skipped when out of bounds."""
    r = nl.ndarray((1, 1), nl.int32, buffer=nl.sbuf)
    nisa.dma_copy(dst=r, src=row)
    t = nl.ndarray((4, 2), src.dtype, buffer=nl.sbuf)
    nisa.memset(dst=t, value=-1.0)
    nisa.dma_transpose(dst=t, src=src.ap([[4, 2], [1, 4]], offset=0, scalar_offset=r,
                                         indirect_dim=0), oob_mode=nisa.oob_mode.skip)
    out = nl.ndarray((4, 2), src.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=t)
    return out


@pytest.mark.parametrize("row, written", [(1, True), (4, False)])
def test_a_dropped_transpose_source_leaves_the_destination(row, written):
    src = (np.arange(5 * 4, dtype=np.float32).reshape(5, 4) + 1).astype(ml_dtypes.bfloat16)
    with simulate.use_target("trn2"):
        got = transpose_rows_skipping(src, np.array([[row]], np.int32))
    want = src[row:row + 2].T if written else np.full((4, 2), -1.0, ml_dtypes.bfloat16)
    np.testing.assert_array_equal(got, want)


@jit
def accumulate_after(x, other_write):
    """nc_matmul into PSUM, then (optionally) a VectorE write of the same tile, then a matmul
    with accumulate=True onto it."""
    ps = nl.ndarray((4, 4), nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=ps, stationary=x, moving=x, accumulate=False)
    if other_write:
        nisa.memset(dst=ps[0:1, :], value=0.0)
    nisa.nc_matmul(dst=ps, stationary=x, moving=x, accumulate=True)
    out_sb = nl.ndarray((4, 4), nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=out_sb, src=ps)
    out = nl.ndarray((4, 4), nl.float32, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=out_sb)
    return out


@jit
def load_and_accumulate(x, other_write):
    x_sb = nl.ndarray((4, 4), nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=x_sb, src=x)
    return accumulate_after(x_sb, other_write)


@pytest.mark.parametrize("target", ["trn1", "trn2"])
def test_a_write_of_another_engine_ends_psum_accumulation(target):
    x = np.eye(4, dtype=np.float32)
    with simulate.use_target(target):
        np.testing.assert_array_equal(load_and_accumulate(x, False), 2 * x)
        with pytest.raises(simulate.SimulationError, match="not last written by nc_matmul"):
            load_and_accumulate(x, True)


@jit
def transpose_gathered_rows(src, idx):
    """dst [W, 16] (SBUF, preset to -1) = src rows idx[p] [16, W] gathered and transposed by one
    indirect dma_transpose, rows out of bounds skipped."""
    W = src.shape[1]
    idx_sb = nl.ndarray((16, 1), idx.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=idx_sb, src=idx)
    t = nl.ndarray((W, 16), src.dtype, buffer=nl.sbuf)
    nisa.memset(dst=t, value=-1.0)
    nisa.dma_transpose(dst=t, src=src.ap([[W, 16], [1, W]], offset=0, vector_offset=idx_sb,
                                         indirect_dim=0), oob_mode=nisa.oob_mode.skip)
    out = nl.ndarray((W, 16), src.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=t)
    return out


def test_an_indirect_transpose_leaves_the_columns_of_skipped_rows():
    src = (np.arange(20 * 8, dtype=np.float32).reshape(20, 8) + 1).astype(ml_dtypes.bfloat16)
    idx = np.arange(16, dtype=np.uint32)[::-1].reshape(16, 1).copy()
    idx[[3, 9]] = [[20], [400]]                             # out of bounds: skipped
    with simulate.use_target("trn2"):
        got = transpose_gathered_rows(src, idx)
    want = src[np.clip(idx[:, 0], 0, 19)].T.copy()
    want[:, [3, 9]] = -1.0
    np.testing.assert_array_equal(got, want)


def test_an_indirect_transpose_takes_uint32_indices_only():
    """The documented limit (indices.dtype is uint32): int32 row ids are refused, naming them."""
    src = np.ones((20, 8), ml_dtypes.bfloat16)
    idx = np.arange(16, dtype=np.int32).reshape(16, 1)
    with simulate.use_target("trn2"), pytest.raises(simulate.ValidationError,
                                                    match="vector_offset.*uint32"):
        transpose_gathered_rows(src, idx)


@jit
def add_gathered_rows(src, idx, base):
    """dst [P, W] = base + src rows idx[p] by a read-modify-write dma_compute, rows out of bounds
    skipped (dst preset to -1 there before)."""
    P, W = base.shape
    idx_sb = nl.ndarray((P, 1), nl.int32, buffer=nl.sbuf)
    nisa.dma_copy(dst=idx_sb, src=idx)
    b = nl.ndarray((P, W), base.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=b, src=base)
    t = nl.ndarray((P, W), base.dtype, buffer=nl.sbuf)
    nisa.memset(dst=t, value=-1.0)
    nisa.dma_compute(dst=t, srcs=[b, src.ap([[W, P], [1, W]], offset=0, vector_offset=idx_sb,
                                          indirect_dim=0)],
                     reduce_op=nl.add, oob_mode=nisa.oob_mode.skip)
    out = nl.ndarray((P, W), base.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=t)
    return out


def test_a_gathering_dma_compute_leaves_the_rows_it_skipped():
    src = np.arange(6 * 3, dtype=np.float32).reshape(6, 3) + 1
    base = np.full((4, 3), 100.0, np.float32)
    idx = np.array([[5], [6], [0], [-1]], np.int32)          # rows 1 and 3 out of bounds
    with simulate.use_target("trn2"):
        got = add_gathered_rows(src, idx, base)
    want = np.full((4, 3), -1.0, np.float32)
    want[0], want[2] = 100 + src[5], 100 + src[0]
    np.testing.assert_array_equal(got, want)


@jit
def skip_into_other_rows(src, idx, op_name):
    """A gather of 4 rows of 3 (rows out of bounds skipped) into a [2, 6] tile: the same element
    count, but the skipped rows name no destination row."""
    idx_sb = nl.ndarray((4, 1), nl.int32, buffer=nl.sbuf)
    nisa.dma_copy(dst=idx_sb, src=idx)
    gathered = src.ap([[3, 4], [1, 3]], offset=0, vector_offset=idx_sb, indirect_dim=0)
    t = nl.ndarray((2, 6), src.dtype, buffer=nl.sbuf)
    if op_name == "dma_copy":
        nisa.dma_copy(dst=t, src=gathered, oob_mode=nisa.oob_mode.skip)
    else:
        base = nl.ndarray((2, 6), src.dtype, buffer=nl.sbuf)
        nisa.memset(dst=base, value=0.0)
        nisa.dma_compute(dst=t, srcs=[base, gathered], reduce_op=nl.add,
                         oob_mode=nisa.oob_mode.skip)
    return t


@pytest.mark.parametrize("op_name, operand", [("dma_copy", "src"), ("dma_compute", "srcs[1]")])
def test_skipped_source_rows_need_as_many_destination_rows(op_name, operand):
    src = np.arange(6 * 3, dtype=np.float32).reshape(6, 3)
    idx = np.array([[5], [6], [0], [1]], np.int32)            # row 1 out of bounds
    with simulate.use_target("trn2"), pytest.raises(simulate.SimulationError) as err:
        skip_into_other_rows(src, idx, op_name)
    assert f"skipped rows of {operand} need dst rows to match" in str(err.value)
    assert f"{operand} has 4 rows" in str(err.value) and "dst dim 0 is 2" in str(err.value)
