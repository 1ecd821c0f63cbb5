"""The host checks' exact refusals and boundaries (what a caller reads, and the values just inside
each rule), for the allocator, the converters, the block-table entries and the attention checks."""

import re

import numpy as np
import pytest

from nki_kernels.block_tables import (append_kv_with_block_tables, attention_with_block_tables,
                                      block_tables_to_csr, csr_to_block_tables, kv_pair)
from nki_kernels.paged_attention.checks import check_batch_decode_inputs
from nki_kernels.paged_attention.work import MAX_KV_LEN
from nki_kernels.paged_cache.quantize import FP32_MAX, check_scale
from nki_kernels.paged_kv_append import PagedKVCache


def refused(error, message, call, *args, **kwargs):
    """``call`` raises ``error`` whose text is exactly ``message``."""
    with pytest.raises(error) as info:
        call(*args, **kwargs)
    assert str(info.value) == message, str(info.value)


def test_allocator_defaults_and_constructor_refusals():
    cache = PagedKVCache(3, 4, 2, 8)
    assert cache.data.shape == (3, 2, 4, 2, 8) and (cache.data == 0).all()
    refused(ValueError, "kv_layout='BHD' must be 'NHD' or 'HND'", PagedKVCache, 3, 4, 2, 8,
            kv_layout="BHD")
    refused(ValueError, "num_kv_heads=0 must be >= 1", PagedKVCache, 3, 4, 0, 8)
    refused(ValueError, "head_dim=0 must be >= 1", PagedKVCache, 3, 4, 2, 0)
    refused(TypeError, "num_pages=2.0 must be an integer, got float", PagedKVCache, 2.0, 4, 2, 8)
    with pytest.raises(TypeError, match=r"^dtype=int64 must be one of \("):
        PagedKVCache(3, 4, 2, 8, dtype=np.int64)


def test_allocator_request_rules():
    cache = PagedKVCache(8, 4, 1, 4)
    cache.add_request("a")
    refused(KeyError, "\"request 'a' already exists\"", cache.add_request, "a")
    refused(KeyError, "\"request 'x' is not in the cache (add_request first; 1 known)\"",
            cache.reserve, ["x"], [1])
    cache.add_request("b")
    refused(ValueError, "rids ['a', 'a'] name a request twice", cache.reserve, ["a", "a"], [1, 1])
    rows = np.zeros((2, 1, 4), np.float32)
    refused(ValueError, "rids ['a', 'a'] name a request twice", cache.append, ["a", "a"], rows,
            rows, [1, 1])
    refused(ValueError, "num_new_tokens has shape (2,); it must give one count per request "
                        "(1, one per rid)", cache.reserve, ["a"], [1, 2])
    refused(ValueError, "append_lens has shape (1,); it must give one count per request "
                        "(2, one per rid)", cache.append, ["a", "b"], rows, rows, [2])
    refused(TypeError, "num_new_tokens must hold integers, got True", cache.reserve, ["a"], True)
    cache.reserve(["a", "b"], [0, 0])                          # zero counts are counts
    assert cache.num_free_pages == 8


def test_truncate_keeps_the_pages_its_tokens_need():
    cache = PagedKVCache(8, 4, 1, 4)
    cache.add_request("a")
    cache.add_request("empty")
    cache.reserve(["a"], [11])                                 # 3 pages
    cache.truncate("a", 11)                                    # its own length: nothing changes
    assert len(cache.pages("a")) == 3
    cache.truncate("a", 5)                                     # 5 tokens need 2 pages of 4
    assert len(cache.pages("a")) == 2 and cache.num_free_pages == 6
    indptr, indices, last = cache.page_table(["a", "empty"])
    assert indptr.tolist() == [0, 2, 2] and last.tolist() == [1, 0]


def test_a_failed_append_rolls_back_lengths_and_pages():
    cache = PagedKVCache(8, 4, 1, 4)
    cache.add_request("a")
    cache.reserve(["a"], [3])
    before = (cache.seq_len("a"), cache.pages("a"), cache.num_free_pages)
    rows = np.zeros((6, 1, 4), np.float64)                     # not the cache dtype: refused
    with pytest.raises(TypeError, match="append_key dtype float64 must equal the cache dtype"):
        cache.append(["a"], rows, rows, [6])
    assert (cache.seq_len("a"), cache.pages("a"), cache.num_free_pages) == before


def test_scales_at_the_float32_limits():
    assert check_scale("k_scale", FP32_MAX, 2).dtype == np.float32
    assert check_scale("k_scale", np.array([1.0, 2.0]), 2).dtype == np.float32
    assert check_scale("k_scale", float(np.finfo(np.float32).tiny), 1)[0] > 0


def test_converter_messages():
    refused(ValueError, "kv_indptr must have batch + 1 >= 1 entries", csr_to_block_tables,
            np.zeros(0, np.int32), np.zeros(0, np.int32), np.zeros(0, np.int32), 4)
    refused(ValueError, "kv_last_page_len has 2 entries, expected 1 (batch: kv_indptr has B + 1)",
            csr_to_block_tables, np.array([0, 1], np.int32), np.array([3], np.int32),
            np.array([1, 1], np.int32), 4)
    refused(ValueError, "kv_indices[2]=-2 is not a page id (ids are >= 0)", csr_to_block_tables,
            np.array([0, 3], np.int32), np.array([0, 5, -2], np.int32), np.array([1], np.int32), 4)
    big = 2 ** 20                                              # 4096 pages of 2**20 tokens
    refused(ValueError, "a request's length exceeds int32 (seq_lens is int32)",
            csr_to_block_tables, np.array([0, 4096], np.int32), np.zeros(4096, np.int32),
            np.array([big], np.int32), big)
    refused(ValueError, "block_tables[0, 1]=6 is not a page of the cache (0..5)",
            block_tables_to_csr, np.array([[0, 6]], np.int32), np.array([8], np.int32), 4, 6)
    refused(TypeError, "block_tables must be a 2-D int32 array [B, max_blocks], got list ",
            block_tables_to_csr, [[0]], np.array([1], np.int32), 4)
    refused(ValueError, "a kv_cache pair must be (k_cache, v_cache): two 4-D arrays "
                        "[N, H, P, D] (HND) / [N, P, H, D] (NHD)", kv_pair, (np.zeros(3),))
    refused(ValueError, "kv_cache shape (3,) must be (2, N, H, P, D) (HND) / (2, N, P, H, D) "
                        "(NHD), or pass a (k_cache, v_cache) pair", kv_pair, np.zeros(3))


def test_block_table_entry_messages(rng):
    cache = rng.standard_normal((2, 6, 2, 4, 8)).astype(np.float32)
    tables = np.array([[0, 1, -1], [2, 3, 4]], np.int32)
    seq_lens = np.array([5, 10], np.int32)
    refused(ValueError, "query_start_loc has 2 entries, expected 3 (batch + 1: seq_lens has one "
                        "entry per request)", attention_with_block_tables,
            np.zeros((2, 4, 8), np.float32), cache, tables, seq_lens, np.array([0, 2], np.int32))
    rows = np.zeros((15, 2, 8), np.float32)
    refused(ValueError, "request 1 has 10 new tokens (query_start_loc) but seq_lens[1]=5: "
                        "seq_lens counts the new tokens too", append_kv_with_block_tables, rows,
            rows, cache, tables, np.array([5, 5], np.int32), np.array([0, 5, 15], np.int32))


def test_block_table_append_passes_the_cores_on():
    """lnc=2 is taken on trn2 and refused by name on trn1 (the append runs one core per K/V)."""
    from nki_kernels import simulate
    cache = np.zeros((2, 4, 2, 4, 8), np.float32)
    tables, seq_lens = np.array([[0]], np.int32), np.array([1], np.int32)
    rows = np.ones((1, 2, 8), np.float32)
    with simulate.use_target("trn1"), pytest.raises(ValueError, match="lnc=2"):
        append_kv_with_block_tables(rows, rows, cache, tables, seq_lens,
                                    np.array([0, 1], np.int32), lnc=2)
    assert not cache.any()


def _decode_case():
    cache = np.zeros((4, 2, 4, 2, 8), np.float32)
    table = (np.array([0, 1, 2], np.int32), np.array([0, 1], np.int32),
             np.array([4, 4], np.int32))
    return np.zeros((2, 4, 8), np.float32), cache, table


def test_decode_check_messages_name_where_lengths_come_from():
    q, cache, (indptr, indices, last) = _decode_case()
    refused(ValueError, "kv_indptr has 3 entries, expected 4 (batch + 1; q has 3 rows, one per "
                        "request)", check_batch_decode_inputs, np.zeros((3, 4, 8), np.float32),
            cache, indptr, indices, last, "NHD", None, 0.0, -1, None, 1.0, 1.0)
    refused(TypeError, "kv_indices dtype int64 must be int32 (int64 index arrays are refused, as "
                       "in FlashInfer)", check_batch_decode_inputs, q, cache, indptr,
            indices.astype(np.int64), last, "NHD", None, 0.0, -1, None, 1.0, 1.0)
    refused(ValueError, "kv_last_page_len has 1 entries, expected 2 (batch; q has 2 rows, one per "
                        "request)", check_batch_decode_inputs, q, cache, indptr, indices, last[:1],
            "NHD", None, 0.0, -1, None, 1.0, 1.0)


def test_decode_checks_take_per_head_scales_and_check_each():
    q, cache, table = _decode_case()
    ok = check_batch_decode_inputs(q, cache, *table, "NHD", None, 0.0, -1, None,
                                   np.array([0.5, 2.0], np.float32), np.array([1.0, 3.0]))
    assert ok.group == 2
    with pytest.raises(ValueError, match=re.escape("v_scale array must be float with shape "
                                                   "(num_kv_heads,) = (2,)")):
        check_batch_decode_inputs(q, cache, *table, "NHD", None, 0.0, -1, None,
                                  np.array([0.5, 2.0], np.float32), np.ones(3))
    with pytest.raises(ValueError, match="k_scale=0.0 must be a positive finite number"):
        check_batch_decode_inputs(q, cache, *table, "NHD", None, 0.0, -1, None,
                                  np.array([0.0, 2.0], np.float32), 1.0)


def test_the_longest_request_the_kernel_takes():
    """Exactly 2**24 - 1 keys pass the host checks (no launch here); one more is refused."""
    pages = 2 ** 16
    cache = np.zeros((1, 2, 256, 1, 8), np.float32)
    q = np.zeros((1, 1, 8), np.float32)
    indptr, indices = np.array([0, pages], np.int32), np.zeros(pages, np.int32)
    prob = check_batch_decode_inputs(q, cache, indptr, indices, np.array([255], np.int32), "NHD",
                                     None, 0.0, -1, None, 1.0, 1.0)
    assert prob.kv_lens.tolist() == [MAX_KV_LEN]
    with pytest.raises(ValueError, match="request 0 has 16777216 keys"):
        check_batch_decode_inputs(q, cache, indptr, indices, np.array([256], np.int32), "NHD",
                                  None, 0.0, -1, None, 1.0, 1.0)


def test_block_table_decode_reference(rng):
    from nki_kernels.block_tables import attention_with_block_tables_ref
    from nki_kernels.paged_attention import batch_decode_ref
    cache = rng.standard_normal((2, 6, 2, 4, 8)).astype(np.float32)
    tables = np.array([[0, 1, -1], [2, 3, 4]], np.int32)
    seq_lens = np.array([5, 10], np.int32)
    q = rng.standard_normal((2, 4, 8)).astype(np.float32)
    indptr, indices, last = block_tables_to_csr(tables, seq_lens, 4)
    want = batch_decode_ref(q, (cache[0], cache[1]), indptr, indices, last, "HND",
                            logits_soft_cap=5.0)
    got = attention_with_block_tables_ref(q, cache, tables, seq_lens, logits_soft_cap=5.0)
    np.testing.assert_array_equal(got, want)
    assert not np.array_equal(got, attention_with_block_tables_ref(q, cache, tables, seq_lens))


def test_fused_write_refusals():
    from nki_kernels.paged_attention import batch_prefill
    cache = np.zeros((4, 2, 4, 1, 8), np.float32)
    q = np.zeros((3, 2, 8), np.float32)
    table = (np.array([0, 1, 2], np.int32), np.array([0, 1], np.int32), np.array([2, 4], np.int32))
    rows = np.zeros((3, 1, 8), np.float32)
    qo = np.array([0, 1, 3], np.int32)
    refused(ValueError, "append_key and append_value go together: give both or neither",
            batch_prefill, q, cache, qo, *table, append_key=rows)
    refused(ValueError, "append_value has 2 rows; it must have one per query token (3)",
            batch_prefill, q, cache, qo, *table, append_key=rows, append_value=rows[:2])
    refused(ValueError, "append: request 0 writes 3 new tokens (qo_indptr) but its page table "
                        "holds 2 (kv_indptr / kv_last_page_len must count the new tokens)",
            batch_prefill, q, cache, np.array([0, 3, 3], np.int32), *table, append_key=rows,
            append_value=rows)
    assert not cache.any()


def test_max_blocks_is_a_count():
    args = (np.array([0, 1], np.int32), np.array([3], np.int32), np.array([2], np.int32), 4)
    refused(ValueError, "max_blocks=-1 must be >= 0", csr_to_block_tables, *args, max_blocks=-1)
    refused(TypeError, "max_blocks=2.0 must be an integer, got float", csr_to_block_tables, *args,
            max_blocks=2.0)


def test_a_bad_append_is_refused_for_what_it_is_before_pages_are_counted():
    """Regression (the slow fuzz's fixed seed): keys of the wrong head_dim when the pool is short
    of pages are refused for their shape (ValueError), not as OutOfPages, and nothing changes."""
    from nki_kernels.paged_kv_append import OutOfPages
    cache = PagedKVCache(2, 4, 1, 8)
    cache.add_request("a")
    cache.reserve(["a"], [7])                                   # both pages taken
    rows = np.zeros((2, 1, 1), np.float32)                      # head_dim 1, not 8
    refused(ValueError, "keys shape (2, 1, 1) must be [rows, 1, 8] (the cache's heads and "
                        "head_dim)", cache.append, ["a"], rows, rows, [2])
    assert cache.seq_len("a") == 7 and cache.num_free_pages == 0
    with pytest.raises(OutOfPages):
        cache.append(["a"], np.zeros((2, 1, 8), np.float32), np.zeros((2, 1, 8), np.float32), [2])
