"""In-place writes: read-only or overlapping caches are refused before any byte is written, rows
that alias the cache are read before the first write, and padding rows (batch -1) are skipped."""

import numpy as np
import pytest

from nki_kernels.paged_kv_append import (append_paged_kv_cache, append_paged_kv_cache_ref,
                                         get_batch_indices_positions, reshape_and_cache)

from .conftest import make_append_case


def _separate(rng, layout="NHD"):
    return make_append_case(rng, [20, 9], [4, 9], 8, 2, 4, layout=layout, fused=False)


def test_read_only_v_cache_is_refused_before_k_is_written(rng, target):
    args = list(_separate(rng))
    k_cache, v_cache = args[4]
    v_cache.flags.writeable = False
    before = k_cache.copy()
    with pytest.raises(ValueError, match="v_cache is read-only"):
        append_paged_kv_cache(*args)
    np.testing.assert_array_equal(k_cache.view(np.uint32), before.view(np.uint32))


def test_read_only_value_cache_of_reshape_and_cache(rng, target):
    key_cache = np.zeros((4, 8, 2, 4), np.float32)
    value_cache = np.zeros_like(key_cache)
    value_cache.flags.writeable = False
    kv = np.ones((3, 2, 4), np.float32)
    with pytest.raises(ValueError, match="value_cache is read-only"):
        reshape_and_cache(kv, kv, key_cache, value_cache, np.array([0, 9, 17], np.int32))
    assert not key_cache.any()


def test_the_same_array_as_k_and_v_cache_is_refused(rng, target):
    args = list(_separate(rng))
    k_cache = args[4][0]
    args[4] = (k_cache, k_cache)
    before = k_cache.copy()
    with pytest.raises(ValueError, match="share memory"):
        append_paged_kv_cache(*args)
    np.testing.assert_array_equal(k_cache.view(np.uint32), before.view(np.uint32))


def test_rows_that_view_the_cache_are_read_before_writing(rng, target):
    """The appended K rows are a view of cache rows the append overwrites: the result is as if
    every input had been read first (both targets)."""
    args = list(make_append_case(rng, [512], [512], 16, 1, 8, fused=False, spare_pages=2))
    k_cache = args[4][0]
    k_cache[...] = rng.standard_normal(k_cache.shape).astype(np.float32)
    k_view = k_cache.reshape(-1, 1, 8)[:512]        # K rows the append overwrites, 4 tiles of 128
    args[0] = k_view
    want = append_paged_kv_cache_ref(k_view.copy(), *args[1:])
    append_paged_kv_cache(*args)
    for got, ref in zip(args[4], want):
        np.testing.assert_array_equal(got.view(np.uint32), ref.view(np.uint32))


def test_padding_rows_of_get_batch_indices_positions_are_skipped(rng, target):
    args = list(make_append_case(rng, [20, 9], [4, 9], 8, 2, 4))
    batch, positions = get_batch_indices_positions(np.array([0, 4, 13], np.int32),
                                                   np.array([20, 9], np.int32), 16)
    assert (batch[13:] == -1).all()
    k = np.concatenate([args[0], np.full((3, 2, 4), 7.0, np.float32)])
    v = np.concatenate([args[1], np.full((3, 2, 4), 7.0, np.float32)])
    want = append_paged_kv_cache_ref(k, v, batch, positions, *args[4:])
    append_paged_kv_cache(k, v, batch, positions, *args[4:])
    np.testing.assert_array_equal(args[4].view(np.uint32), want.view(np.uint32))
    assert not (args[4] == 7.0).any()


def test_other_negative_batch_indices_are_still_refused(rng):
    args = list(make_append_case(rng, [20, 9], [4, 9], 8, 2, 4))
    args[2] = args[2].copy()
    args[2][0] = -2
    with pytest.raises(ValueError, match=r"batch_indices\[0\]=-2 .* or -1 \(padding\)"):
        append_paged_kv_cache(*args)


def test_a_cache_with_page_size_zero_is_refused():
    cache = np.zeros((4, 2, 0, 2, 4), np.float32)
    z = np.zeros((0, 2, 4), np.float32)
    i0 = np.zeros(0, np.int32)
    with pytest.raises(ValueError, match="page size 0"):
        append_paged_kv_cache(z, z, i0, i0, cache, i0, np.zeros(1, np.int32), i0)


def test_page_table_helper_errors_name_the_request():
    from nki_kernels.paged_kv_append import PagedKVCache
    cache = PagedKVCache(8, 4, 2, 4)
    cache.add_request("a")
    with pytest.raises(KeyError, match="request 'b' is not in the cache"):
        cache.free_request("b")
    with pytest.raises(ValueError, match="name a request twice"):
        cache.reserve(["a", "a"], 1)
    with pytest.raises(ValueError, match="must be >= 0"):
        cache.reserve(["a"], -3)
    assert cache.seq_len("a") == 0 and cache.num_free_pages == 8


def test_a_float64_cache_is_refused_as_the_cache():
    cache = np.zeros((4, 2, 8, 2, 4))
    rows = np.zeros((1, 2, 4))
    i = np.zeros(1, np.int32)
    with pytest.raises(TypeError, match="cache dtype float64 is not a NeuronCore element type"):
        append_paged_kv_cache(rows, rows, i, i, cache, i, np.array([0, 1], np.int32), i + 1)


def test_padding_rows_alone_with_an_empty_page_table_write_nothing(target):
    """Only padding rows (batch -1) and a request with no pages: nothing to index, nothing written
    (this read kv_indices[0] of an empty table before)."""
    cache = np.zeros((2, 2, 4, 1, 4), np.float32)
    rows = np.ones((2, 1, 4), np.float32)
    append_paged_kv_cache(rows, rows, np.array([-1, -1], np.int32), np.zeros(2, np.int32), cache,
                          np.zeros(0, np.int32), np.array([0, 0], np.int32),
                          np.array([0], np.int32))
    assert not cache.any()
