"""TensorScatter kernel (simulator) vs the NumPy reference, bit for bit, over axes/ranks/modes/dtypes."""

import itertools

import ml_dtypes
import numpy as np
import pytest

from nki_kernels import simulate
from nki_kernels.tensor_scatter import tensor_scatter, tensor_scatter_, tensor_scatter_ref


def make_case(rng, shape, axis, seq_len, mode, dtype=np.float32, batch_wrap=3):
    cache = rng.standard_normal(shape).astype(dtype)
    ushape = list(shape)
    ushape[axis] = seq_len
    update = rng.standard_normal(ushape).astype(dtype)
    max_seq = shape[axis]
    high = max_seq - seq_len + 1 if mode == "linear" else batch_wrap * max_seq
    w = rng.integers(0, high, size=shape[0]).astype(np.int64)
    return cache, update, w


def bits(a):
    return np.ascontiguousarray(a).view(np.uint8)


CASES = [  # (shape, axis, seq_len)
    ((2, 3, 8, 5), -2, 1), ((2, 3, 8, 5), -2, 3), ((2, 3, 8, 5), -2, 8),
    ((4, 7, 6), 1, 6), ((4, 7, 6), 1, 1), ((3, 9), 1, 2), ((2, 4, 6), -1, 3),
    ((3, 5, 4, 2, 3), 2, 4), ((1, 2, 3, 4, 5), 4, 5), ((5, 3, 130, 2), 2, 129),
]


@pytest.mark.parametrize("mode", ["linear", "circular"])
@pytest.mark.parametrize("shape, axis, seq_len", CASES, ids=str)
def test_matches_reference(rng, target, shape, axis, seq_len, mode):
    cache, update, w = make_case(rng, shape, axis, seq_len, mode)
    out = tensor_scatter(cache, update, w, axis, mode)
    np.testing.assert_array_equal(bits(out), bits(tensor_scatter_ref(cache, update, w, axis, mode)))


DTYPES = [np.float32, np.float16, ml_dtypes.bfloat16, ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2,
          np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64,
          np.float64, np.bool_, np.complex64]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_dtypes_bit_exact(rng, dtype):
    shape = (3, 2, 7, 3)
    cache = rng.integers(0, 255, size=(int(np.prod(shape)) * np.dtype(dtype).itemsize,),
                         dtype=np.uint8).view(dtype).reshape(shape)   # arbitrary bit patterns, NaNs too
    update = rng.integers(0, 255, size=(3 * 2 * 4 * 3 * np.dtype(dtype).itemsize,),
                          dtype=np.uint8).view(dtype).reshape(3, 2, 4, 3)
    w = np.array([0, 5, 13], np.int64)
    out = tensor_scatter(cache, update, w, axis=2, mode="circular")
    np.testing.assert_array_equal(bits(out), bits(tensor_scatter_ref(cache, update, w, 2, "circular")))


def test_hand_computed_linear_and_wrap():
    # cache (1, 4) zeros; update [1, 2] at w=3 in circular mode -> positions 3 and (4 mod 4) = 0.
    out = tensor_scatter(np.zeros((1, 4), np.float32), np.array([[1.0, 2.0]], np.float32),
                         np.array([3]), axis=1, mode="circular")
    np.testing.assert_array_equal(out, [[2.0, 0.0, 0.0, 1.0]])
    # linear at w=1 -> positions 1, 2.
    out = tensor_scatter(np.zeros((1, 4), np.float32), np.array([[1.0, 2.0]], np.float32),
                         np.array([1]), axis=1, mode="linear")
    np.testing.assert_array_equal(out, [[0.0, 1.0, 2.0, 0.0]])


def test_in_place_touches_only_update_rows(rng, target):
    cache = np.full((4, 3, 16, 8), np.nan, np.float32)
    update = rng.standard_normal((4, 3, 5, 8)).astype(np.float32)
    w = np.array([0, 11, 14, 3], np.int64)
    before = cache.copy()
    tensor_scatter_(cache, update, w, axis=2, mode="circular")
    for b in range(4):
        rows = [(w[b] + s) % 16 for s in range(5)]
        np.testing.assert_array_equal(cache[b][:, rows], update[b])
        untouched = np.setdiff1d(np.arange(16), rows)
        np.testing.assert_array_equal(bits(cache[b][:, untouched]), bits(before[b][:, untouched]))


@pytest.mark.sim_only
@pytest.mark.parametrize("mode", ["linear", "circular"])
def test_traffic_is_the_update_bytes(rng, target, mode):
    cache, update, w = make_case(rng, (8, 4, 64, 32), -2, 3, mode)
    tensor_scatter_(cache, update, w, axis=-2, mode=mode)
    trace = simulate.last_trace()
    # HBM traffic: update read + written (staging through SBUF reads and writes each byte once
    # more on chip, not in HBM), plus the write indices (8 x 4 bytes, per batch broadcasts).
    update_bytes = update.nbytes
    index_bytes = trace.hbm_bytes - 2 * update_bytes
    assert 0 < index_bytes <= 8 * 4 * 128 + 8 * 4


BAD = [
    (dict(axis=0), ValueError, "axis must not be 0"),
    (dict(axis=4), ValueError, "axis=4 is out of range"),
    (dict(mode="ring"), ValueError, "mode='ring'"),
    (dict(write_indices=np.array([0, 6], np.int64)), ValueError, r"write_indices\[1\]=6 \+ 3 > 8"),
    (dict(write_indices=np.array([0, -1], np.int64)), ValueError, "is negative"),
    (dict(write_indices=np.array([0, 1], np.int32)), TypeError, "must be int64"),
    (dict(write_indices=np.array([0, 1, 2], np.int64)), ValueError, r"must be \(batch,\)"),
    (dict(update_shape=(2, 3, 9, 5)), ValueError, "exceeds max_sequence_length"),
    (dict(update_shape=(2, 4, 3, 5)), ValueError, "differs from past_cache shape"),
    (dict(update_dtype=np.float16), TypeError, "update dtype float16"),
]


@pytest.mark.parametrize("kwargs, exc, match", BAD, ids=lambda x: str(x)[:40])
def test_bad_input_refused_before_any_write(kwargs, exc, match):
    cache = np.zeros((2, 3, 8, 5), np.float32)
    kwargs = dict(kwargs)           # the parameter is shared by every run of the test
    update = np.ones(kwargs.pop("update_shape", (2, 3, 3, 5)), kwargs.pop("update_dtype", np.float32))
    args = dict(write_indices=np.array([0, 2], np.int64), axis=-2, mode="linear")
    args.update(kwargs)
    with pytest.raises(exc, match=match):
        tensor_scatter_(cache, update, **args)
    assert not cache.any()                       # nothing written


def test_string_dtype_refused():
    with pytest.raises(TypeError, match="not supported"):
        tensor_scatter_ref(np.array([["a", "b"]]), np.array([["c"]]), axis=1)


@pytest.mark.slow
@pytest.mark.parametrize("rank", [3, 4, 5])
def test_sweep(rng, target, rank):
    for dims in itertools.islice(itertools.product([1, 3], [1, 4], [5, 17], [1, 3], [2]), 12):
        shape = tuple(dims[:rank])
        for axis in range(1, rank):
            for mode in ("linear", "circular"):
                for seq_len in sorted({1, shape[axis] // 2 or 1, shape[axis]}):
                    c, u, w = make_case(rng, shape, axis, seq_len, mode)
                    np.testing.assert_array_equal(tensor_scatter(c, u, w, axis, mode),
                                                  tensor_scatter_ref(c, u, w, axis, mode))


@pytest.mark.sim_only
@pytest.mark.parametrize("mode", ["linear", "circular"])
def test_decode_update_is_one_scatter_on_v3(rng, mode):
    cache, update, w = make_case(rng, (40, 8, 64, 16), 2, 1, mode)
    want = tensor_scatter_ref(cache, update, w, 2, mode)
    with simulate.use_target("trn2"):
        tensor_scatter_(cache, update, w, axis=2, mode=mode)
    trace = simulate.last_trace()
    # index load (w[b] on each of batch b's 2 partitions), iota, index add, one HBM-to-HBM
    # scatter for all 40 batches: 4 heads per partition, 80 partitions
    assert trace.count_by_op()["dma_copy"] == 2 and len(trace) == 4
    scatter = trace.events[-1]
    assert scatter.operands[0].shape == (80, 4, 16) and scatter.operands[1].buffer != "sbuf"
    assert trace.hbm_bytes == 2 * update.nbytes + 80 * 4
    np.testing.assert_array_equal(bits(cache), bits(want))


@pytest.mark.sim_only
@pytest.mark.parametrize("shape, dmas", [((130, 3, 16, 8), 2), ((1, 131, 4, 4), 1),
                                         ((5, 6, 7, 3), 1), ((2, 200, 5, 2), 1)])
def test_decode_update_prefix_tiles_on_v3(rng, shape, dmas):
    """Over 128 batches (a batch per partition, 128 per DMA), a prime prefix count over 128
    (one partition for all), prefixes that fit one per partition, and two per partition."""
    cache, update, w = make_case(rng, shape, 2, 1, "linear")
    want = tensor_scatter_ref(cache, update, w, 2, "linear")
    with simulate.use_target("trn2"):
        tensor_scatter_(cache, update, w, axis=2, mode="linear")
    scatters = [e for e in simulate.last_trace() if e.op == "dma_copy"
                and e.operands[0].indirect == "vector"]
    assert len(scatters) == dmas
    np.testing.assert_array_equal(bits(cache), bits(want))


@pytest.mark.parametrize("S, w", [(200, 150), (130, 0), (7, 250)])
def test_in_place_update_that_views_the_cache_reads_before_writing(target, S, w):
    """A circular update that is a view of the cache itself (wrapping, and longer than one tile
    of 128 rows): the result is computed from the original values on both targets."""
    from nki_kernels.tensor_scatter import tensor_scatter_, tensor_scatter_ref
    rng = np.random.default_rng(S)
    cache = rng.standard_normal((1, 256, 8)).astype(np.float32)
    update = cache[:, 40:40 + S]                     # contiguous view of the cache
    want = tensor_scatter_ref(cache.copy(), update.copy(), np.array([w]), 1, "circular")
    tensor_scatter_(cache, update, np.array([w]), axis=1, mode="circular")
    np.testing.assert_array_equal(cache, want)


@pytest.mark.parametrize("row_bytes", [64 * 1024 + 4, 240_000])
def test_circular_rows_wider_than_the_staging_budget(rng, target, row_bytes):
    """A circular write whose rows exceed the per-partition staging budget (one row of 240 KB
    does not fit SBUF at all) is staged in column pieces instead of overflowing SBUF."""
    width = row_bytes // 4
    cache = rng.standard_normal((2, 8, width)).astype(np.float32)
    update = rng.standard_normal((2, 3, width)).astype(np.float32)
    w = np.array([6, 2], np.int64)
    expected = tensor_scatter_ref(cache, update, w, mode="circular")
    np.testing.assert_array_equal(tensor_scatter(cache, update, w, mode="circular"), expected)
