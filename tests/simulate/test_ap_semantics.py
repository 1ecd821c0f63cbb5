"""The simulator's .ap (static, scalar_offset, vector_offset, dtype=) gives exactly what the seed's
pseudo-code loop gives, and refuses every illegal pattern."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from nki_kernels import simulate
from nki_kernels.simulate import jit, nisa, nl


def loop_gather(flat, pattern, offset):
    """The seed's loop: access[i...] = flat[offset + sum(i_k * step_k)]."""
    out = np.empty([n for _, n in pattern], flat.dtype)
    for idx in np.ndindex(*out.shape):
        out[idx] = flat[offset + sum(i * s for i, (s, _) in zip(idx, pattern))]
    return out


@jit
def read_ap(t, pattern, offset):
    shape = tuple(pair[1] for pair in pattern)
    out = nl.ndarray(shape, t.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=t.ap([list(p) for p in pattern], offset=offset))
    return out


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.integers(0, 9), st.integers(1, 4)), min_size=1, max_size=4),
       st.integers(0, 20))
def test_static_ap_equals_seed_loop(pattern, offset):
    flat = np.arange(400, dtype=np.float32)
    lo, hi = offset, offset + sum(s * (n - 1) for s, n in pattern)
    if hi >= 400:
        with pytest.raises(simulate.OutOfBoundsError, match="reaches flat index"):
            read_ap(flat.reshape(20, 20), tuple(pattern), offset)
        return
    np.testing.assert_array_equal(read_ap(flat.reshape(20, 20), tuple(pattern), offset),
                                  loop_gather(flat, pattern, offset))


@jit
def gather_vector(t, idx, inner):
    P = idx.shape[0]
    idx_sb = nl.ndarray((P, 1), nl.int32, buffer=nl.sbuf)
    nisa.dma_copy(dst=idx_sb, src=idx)
    shape = (P,) + tuple(pair[1] for pair in inner)
    out_sb = nl.ndarray((P, int(np.prod(shape[1:]))), t.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=out_sb, src=t.ap([[1, P]] + [list(p) for p in inner], offset=0,
                                       vector_offset=idx_sb, indirect_dim=0))
    out = nl.ndarray(shape, t.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=out_sb)
    return out


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(0, 9), min_size=1, max_size=6),
       st.lists(st.tuples(st.integers(0, 3), st.integers(1, 3)), min_size=1, max_size=2))
def test_vector_offset_equals_seed_loop(rows, inner):
    t = np.arange(10 * 16, dtype=np.float32).reshape(10, 16)   # row size prod(shape[1:]) = 16
    if sum(s * (n - 1) for s, n in inner) >= 16:
        return
    idx = np.array(rows, np.int32).reshape(-1, 1)
    want = np.stack([loop_gather(t.ravel(), inner, r * 16) for r in rows])
    np.testing.assert_array_equal(gather_vector(t, idx, tuple(inner)), want)


@jit
def gather_scalar(t, value, pattern, indirect_dim):
    v_sb = nl.ndarray((1, 1), nl.int32, buffer=nl.sbuf)
    nisa.dma_copy(dst=v_sb, src=value)
    shape = tuple(pair[1] for pair in pattern)
    out = nl.ndarray(shape, t.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=t.ap([list(p) for p in pattern], offset=2, scalar_offset=v_sb,
                                    indirect_dim=indirect_dim))
    return out


@pytest.mark.parametrize("indirect_dim, row", [(0, 60), (1, 12), (2, 3)])
@pytest.mark.parametrize("value", [0, 1, 3])
def test_scalar_offset_scales_by_base_shape(indirect_dim, row, value):
    t = np.arange(4 * 5 * 4 * 3, dtype=np.float32).reshape(4, 5, 4, 3)
    pattern = ((3, 2), (1, 3))
    want = loop_gather(t.ravel(), pattern, 2 + value * row)       # start = offset + value * prod(shape[d+1:])
    got = gather_scalar(t, np.array([[value]], np.int32), pattern, indirect_dim)
    np.testing.assert_array_equal(got, want)


def test_dtype_reinterpret_seed_example():
    # (128, 256) int32 read as bf16 through .ap: 512 elements per partition.
    @jit
    def k(x):
        t = nl.ndarray((128, 256), nl.int32, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x)
        out = nl.ndarray((128, 512), nl.bfloat16, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=t.ap([[512, 128], [1, 512]], offset=0, dtype=nl.bfloat16))
        return out
    x = np.random.default_rng(0).integers(-2 ** 31, 2 ** 31, (128, 256)).astype(np.int32)
    import ml_dtypes
    np.testing.assert_array_equal(k(x).view(np.uint16), x.view(ml_dtypes.bfloat16).view(np.uint16))


@pytest.mark.parametrize("make, exc, match", [
    (lambda t: t.ap([[64, 8], [1, 32]]), simulate.AccessError, "partition step 64 must equal"),
    (lambda t: t.ap([[32, 16], [1, 32]]).ap([[32, 16], [1, 32]]), simulate.AccessError, "already indexed"),
    (lambda t: t.ap([[32, 16], [1, 33]]), simulate.AccessError, "addressed on its own"),
    (lambda t: t.ap([[32, 16], [1, 32]], dtype=nl.float8_e4m3).ap, simulate.AccessError, "partition step 32"),
    (lambda t: t.ap([[32, 16], [1, 32]], scalar_offset=t, vector_offset=t), simulate.AccessError, "at most one"),
])
def test_simulator_refuses_illegal_patterns(make, exc, match):
    t = nl.ndarray((16, 32), nl.float32, buffer=nl.sbuf)
    with pytest.raises(exc, match=match):
        make(t)


def test_vector_offset_row_bounds_are_exact():
    """The last row of the table is readable; one past it is out of bounds (not silently read)."""
    t = np.arange(10 * 16, dtype=np.float32).reshape(10, 16)
    got = gather_vector(t, np.array([[9], [0]], np.int32), ((1, 16),))
    np.testing.assert_array_equal(got, t[[9, 0]])
    for inner in (((1, 16),), ((1, 1),)):           # one element past the end, too
        with pytest.raises(simulate.OutOfBoundsError, match="vector_offset row 0 = 10"):
            gather_vector(t, np.array([[10], [0]], np.int32), inner)


@jit
def hbm_to_sbuf_and_back(t):
    tile = nl.ndarray(t.shape, t.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=tile, src=t)
    out = nl.ndarray(t.shape, t.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=tile)
    flat = nl.ndarray((1, t.shape[0] * t.shape[1]), t.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=flat, src=t.reshape((1, t.shape[0] * t.shape[1])))
    return out


def test_dma_runs_never_span_partitions():
    """The descriptor count of the cost model: a contiguous HBM block loaded into SBUF is one
    run per partition (each partition is its own memory), both ways; HBM to HBM is one run."""
    hbm_to_sbuf_and_back(np.zeros((128, 512), np.float32))
    runs = [e.dma_runs for e in simulate.last_trace() if e.op == "dma_copy"]
    assert runs == [128, 128, 1]


def test_an_operand_that_is_not_a_tensor_is_named():
    """A host array handed to an instruction inside a kernel: a ValidationError naming the
    instruction and the operand, not a NumPy error."""
    @jit
    def kernel(x):
        t = nl.ndarray((2, 4), nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=t, src=np.zeros((2, 4), np.float32))
        return x

    with pytest.raises(simulate.ValidationError,
                       match=r"expected an nl.ndarray, got ndarray") as info:
        kernel(np.zeros((2, 4), np.float32))
    err = info.value
    assert (err.op, err.operand, err.program_id) == ("tensor_copy", "src", (0,))
    assert err.location.rsplit(":", 1)[1].isdigit()           # the kernel line


def test_scalar_offset_bounds_are_exact():
    """The last element is readable; one element past it is refused, naming the instruction and
    the operand (start = offset 2 + 79 rows of 3)."""
    t = np.arange(4 * 5 * 4 * 3, dtype=np.float32).reshape(4, 5, 4, 3)       # 240 elements
    got = gather_scalar(t, np.array([[79]], np.int32), ((1, 1),), 2)
    assert got.tolist() == [239.0]
    with pytest.raises(simulate.OutOfBoundsError, match=r"scalar_offset=79 .*\[239, 240\]") as info:
        gather_scalar(t, np.array([[79]], np.int32), ((1, 2),), 2)
    assert (info.value.op, info.value.operand.split("=")[0]) == ("dma_copy", "src")


def test_vector_offset_with_the_row_level_only():
    """A pattern of just the indirect (row) level reads each row's first element (the page-id
    loads of the kernels: one int32 per partition)."""
    @jit
    def first_of_rows(t, idx):
        idx_sb = nl.ndarray((3, 1), nl.int32, buffer=nl.sbuf)
        nisa.dma_copy(dst=idx_sb, src=idx)
        out_sb = nl.ndarray((3, 1), t.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=out_sb, src=t.ap([[1, 3]], offset=0, vector_offset=idx_sb,
                                           indirect_dim=0))
        out = nl.ndarray((3, 1), t.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=out_sb)
        return out

    t = np.arange(40, dtype=np.float32).reshape(10, 4)
    got = first_of_rows(t, np.array([[7], [0], [9]], np.int32))
    assert got.ravel().tolist() == [28.0, 0.0, 36.0]


def test_zero_dimensional_hbm_views_are_dma_operands():
    """An integer index on a 1-D HBM tensor (the language guide's indexing) is a 0-d view: a
    DMA reads or writes its one element, and the cost model prices it as one run."""
    from nki_kernels.profile import estimate

    @jit
    def k(x):
        t = nl.ndarray((1, 1), x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x[3])
        out = nl.ndarray((4,), x.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out[2], src=t)
        return out

    got = k(np.arange(8, dtype=np.float32))
    assert got[2] == 3.0
    trace = simulate.last_trace()
    assert [e.dma_runs for e in trace] == [1, 1]
    assert estimate(trace, target="trn2").seconds > 0
