"""Host arguments at their edges: fp8 scales that float32 cannot hold, row dtypes checked one by
one, the allocator and the converters validating their own arguments, and refusals through the
block-table entries naming the caller's arguments."""

import ml_dtypes
import numpy as np
import pytest

from nki_kernels.block_tables import (append_kv_with_block_tables, attention_with_block_tables,
                                      csr_to_block_tables)
from nki_kernels.paged_attention import batch_decode, batch_prefill
from nki_kernels.paged_kv_append import PagedKVCache, append_paged_kv_cache, reshape_and_cache

E4M3 = ml_dtypes.float8_e4m3fn
H, D, P = 2, 8, 4


def _fp8_case():
    cache = np.zeros((4, 2, P, H, D), E4M3)
    table = (np.array([0, 1], np.int32), np.array([0, 1], np.int32), np.array([2], np.int32))
    return cache, table


@pytest.mark.parametrize("scale", [1e-40, 1e-39, 1e39, np.float64(2e-38) / 2])
def test_scales_outside_normal_float32_are_refused(scale):
    cache, (pages, indptr, last) = _fp8_case()
    rows = np.zeros((2, H, D), np.float32)
    before = cache.tobytes()
    pos = np.array([0, 1], np.int32)
    with pytest.raises(ValueError, match=r"k_scale=.* must be a positive finite number and a "
                                         r"normal float32"):
        append_paged_kv_cache(rows, rows, np.zeros(2, np.int32), pos, cache, pages, indptr, last,
                              k_scale=scale, v_scale=1.0)
    with pytest.raises(ValueError, match="v_scale=.* normal float32"):
        append_paged_kv_cache(rows, rows, np.zeros(2, np.int32), pos, cache, pages, indptr, last,
                              k_scale=1.0, v_scale=np.array([1.0, scale]))
    with pytest.raises(ValueError, match="k_scale=.* normal float32"):
        batch_decode(np.zeros((1, H, D), np.float32), cache, indptr, pages, last, k_scale=scale)
    assert cache.tobytes() == before


def test_smallest_normal_scale_writes_zeros_as_zeros():
    cache, (pages, indptr, last) = _fp8_case()
    rows = np.zeros((2, H, D), np.float32)
    tiny = float(np.finfo(np.float32).tiny)
    append_paged_kv_cache(rows, rows, np.zeros(2, np.int32), np.array([0, 1], np.int32), cache,
                          pages, indptr, last, k_scale=tiny, v_scale=tiny)
    assert (cache.astype(np.float32)[0, :, :2] == 0).all()


@pytest.mark.parametrize("key_dtype, value_dtype, bad", [
    (np.float32, np.int32, "append_value"), (np.int32, np.float32, "append_key"),
    (np.float32, np.float64, "append_value")])
def test_each_row_dtype_is_checked_when_quantizing(key_dtype, value_dtype, bad):
    cache, (pages, indptr, last) = _fp8_case()
    before = cache.tobytes()
    k, v = np.zeros((2, H, D), key_dtype), np.zeros((2, H, D), value_dtype)
    with pytest.raises(TypeError, match=f"{bad} rows to quantize must be one of"):
        append_paged_kv_cache(k, v, np.zeros(2, np.int32), np.array([0, 1], np.int32), cache,
                              pages, indptr, last, k_scale=1.0, v_scale=1.0)
    q = np.zeros((2, 2 * H, D), np.float32)
    with pytest.raises(TypeError, match=f"{bad} rows to quantize must be one of"):
        batch_prefill(q, cache, np.array([0, 2], np.int32), indptr, pages, last, causal=True,
                      append_key=k, append_value=v, k_scale=1.0, v_scale=1.0)
    assert cache.tobytes() == before


def test_reshape_and_cache_names_its_own_rows():
    cache, _ = _fp8_case()
    with pytest.raises(TypeError, match="key rows to quantize must be one of"):
        reshape_and_cache(np.zeros((1, H, D), np.int32), np.zeros((1, H, D), np.int32), cache,
                          None, np.array([0]), k_scale=1.0, v_scale=1.0)


@pytest.mark.parametrize("last, rule", [([0], r"kv_last_page_len\[0\]=0 must be in \[1, page_size=4\]"),
                                        ([5], r"kv_last_page_len\[0\]=5 must be in \[1, page_size=4\]")])
def test_csr_to_block_tables_checks_last_page_len(last, rule):
    with pytest.raises(ValueError, match=rule):
        csr_to_block_tables(np.array([0, 2], np.int32), np.array([3, 1], np.int32),
                            np.array(last, np.int32), 4)


def test_csr_to_block_tables_checks_page_size_and_ids():
    args = (np.array([0, 2], np.int32), np.array([3, 1], np.int32), np.array([2], np.int32))
    with pytest.raises(ValueError, match="page_size=0 must be >= 1"):
        csr_to_block_tables(*args, 0)
    with pytest.raises(TypeError, match="page_size=4.0 must be an integer"):
        csr_to_block_tables(*args, 4.0)
    with pytest.raises(ValueError, match=r"kv_indices\[1\]=-2 is not a page id"):
        csr_to_block_tables(args[0], np.array([3, -2], np.int32), args[2], 4)
    with pytest.raises(ValueError, match="kv_last_page_len\\[0\\]=1 must be 0 for a request "
                                         "with no pages"):
        csr_to_block_tables(np.array([0, 0], np.int32), np.zeros(0, np.int32),
                            np.array([1], np.int32), 4)
    tables, seq_lens = csr_to_block_tables(*args, 4)
    assert tables.tolist() == [[3, 1]] and seq_lens.tolist() == [6]


@pytest.mark.parametrize("counts, error, rule", [
    ([1.5], TypeError, "num_new_tokens must hold integers, got 1.5"),
    (["3"], TypeError, "num_new_tokens must hold integers, got '3'"),
    ([True], TypeError, "got True"),
    ([1, 2], ValueError, r"num_new_tokens has shape \(2,\); it must give one count per request"),
    (np.array([1.0]), TypeError, "got a float64 array"),
    ([-1], ValueError, r"num_new_tokens\[0\]=-1 must be >= 0"),
])
def test_reserve_takes_integer_counts_only(counts, error, rule):
    cache = PagedKVCache(8, 4, 1, 4)
    cache.add_request("a")
    with pytest.raises(error, match=rule):
        cache.reserve(["a"], counts)
    assert cache.seq_len("a") == 0 and cache.num_free_pages == 8
    cache.reserve(["a"], 5)
    cache.reserve(["a"], np.array([2], np.int64))
    assert cache.seq_len("a") == 7


def test_truncate_and_append_lens_and_constructor_checks():
    cache = PagedKVCache(8, 4, 1, 4)
    cache.add_request("a")
    cache.reserve(["a"], [3])
    for bad in (True, 1.0, "1"):
        with pytest.raises(TypeError, match="new_len=.* must be an integer"):
            cache.truncate("a", bad)
    assert cache.seq_len("a") == 3
    rows = np.zeros((2, 1, 4), np.float32)
    with pytest.raises(TypeError, match="append_lens must hold integers, got 2.0"):
        cache.append(["a"], rows, rows, [2.0])
    with pytest.raises(ValueError, match="append_lens .* must sum to keys' 2 rows"):
        cache.append(["a"], rows, rows, [3])
    assert cache.seq_len("a") == 3
    with pytest.raises(TypeError, match="dtype=float64 must be one of"):
        PagedKVCache(8, 4, 1, 4, dtype=np.float64)
    with pytest.raises(TypeError, match="page_size=4.5 must be an integer"):
        PagedKVCache(8, 4.5, 1, 4)
    with pytest.raises(ValueError, match="num_pages=0 must be >= 1"):
        PagedKVCache(0, 4, 1, 4)


def _block_table_case(rng):
    cache = rng.standard_normal((2, 6, H, P, D)).astype(np.float32)       # HND, 6 pages
    tables = np.array([[0, 1, -1], [2, 3, 4]], np.int32)
    seq_lens = np.array([5, 10], np.int32)
    return cache, tables, seq_lens


def test_block_table_refusals_name_the_callers_arguments(rng):
    cache, tables, seq_lens = _block_table_case(rng)
    before = cache.tobytes()
    q = rng.standard_normal((3, 2 * H, D)).astype(np.float32)
    bad = tables.copy()
    bad[1, 1] = 8
    with pytest.raises(ValueError, match=r"block_tables\[1, 1\]=8 is not a page of the cache"):
        attention_with_block_tables(q[:2], cache, bad, seq_lens)
    with pytest.raises(ValueError, match=r"query_start_loc must be non-decreasing"):
        attention_with_block_tables(q, cache, tables, seq_lens, np.array([0, 2, 1], np.int32))
    with pytest.raises(ValueError, match=r"query_start_loc\[-1\]=1 must equal q's rows \(3\)"):
        attention_with_block_tables(q, cache, tables, seq_lens, np.array([0, 1, 1], np.int32))
    with pytest.raises(ValueError, match=r"block_tables / seq_lens have 2 rows, expected 3"):
        attention_with_block_tables(q, cache, tables, seq_lens)
    with pytest.raises(ValueError, match=r"request 0 has 6 queries \(query_start_loc\) but 5 "
                                         r"keys \(seq_lens\)"):
        attention_with_block_tables(np.zeros((7, 2 * H, D), np.float32), cache, tables,
                                    seq_lens, np.array([0, 6, 7], np.int32))
    rows = np.zeros((3, H, D), np.float32)
    with pytest.raises(ValueError, match=r"query_start_loc\[-1\]=4 exceeds the 3 rows of key"):
        append_kv_with_block_tables(rows, rows, cache, tables, seq_lens,
                                    np.array([0, 2, 4], np.int32))
    with pytest.raises(ValueError, match=r"block_tables\[1, 2\]=6 is not a page"):
        append_kv_with_block_tables(rows, rows, cache, np.array([[0, 1, -1], [2, 3, 6]], np.int32),
                                    seq_lens, np.array([0, 1, 3], np.int32))
    with pytest.raises(ValueError, match=r"request 0 has 6 new tokens \(query_start_loc\) but "
                                         r"seq_lens\[0\]=5"):
        append_kv_with_block_tables(np.zeros((7, H, D), np.float32), np.zeros((7, H, D),
                                    np.float32), cache, tables, seq_lens,
                                    np.array([0, 6, 7], np.int32))
    assert cache.tobytes() == before
