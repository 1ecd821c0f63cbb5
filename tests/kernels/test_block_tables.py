"""Block-table entry points (vLLM-neuron / NxDI) against the CSR ones: the same caches bit for
bit, the same outputs, on randomised page tables, trn1 and trn2; conversions both ways; refusals
by name."""

import ml_dtypes
import numpy as np
import pytest

from nki_kernels.block_tables import (append_kv_with_block_tables, append_kv_with_block_tables_ref,
                                      attention_with_block_tables, attention_with_block_tables_ref,
                                      block_tables_to_csr, csr_to_block_tables)
from nki_kernels.paged_attention import batch_decode, batch_prefill, batch_prefill_ref
from nki_kernels.paged_kv_append import append_paged_kv_cache, get_batch_indices_positions
from nki_kernels.paged_kv_append import reshape_and_cache

N, H, D = 40, 2, 16


def _tables(rng, P, B=5, max_blocks=7):
    """Random block tables (distinct pages, -1 or stale pages past each request's need)."""
    seq_lens = rng.integers(0, max_blocks * P + 1, B).astype(np.int32)
    pages = rng.permutation(N)[: B * max_blocks].reshape(B, max_blocks).astype(np.int32)
    need = -(-seq_lens // P)
    pad = np.arange(max_blocks)[None] >= need[:, None]
    pages[pad & (rng.random(pages.shape) < 0.5)] = -1
    return pages, seq_lens


@pytest.mark.parametrize("P", [1, 3, 4])
def test_conversion_round_trip(rng, P):
    tables, seq_lens = _tables(rng, P)
    indptr, indices, last = block_tables_to_csr(tables, seq_lens, P)
    back, lens = csr_to_block_tables(indptr, indices, last, P, max_blocks=tables.shape[1])
    assert np.array_equal(lens, seq_lens)
    need = -(-seq_lens // P)
    for b in range(tables.shape[0]):
        assert np.array_equal(back[b, :need[b]], tables[b, :need[b]])
        assert (back[b, need[b]:] == -1).all()
    assert np.array_equal(np.diff(indptr), need) and ((last >= 1) | (need == 0)).all()
    assert (last <= P).all()


def _cache(rng, P, layout, dtype=np.float32):
    shape = (2, N, H, P, D) if layout == "HND" else (2, N, P, H, D)
    return rng.standard_normal(shape).astype(dtype)


@pytest.mark.parametrize("layout", ["HND", "NHD"])
@pytest.mark.parametrize("P", [3, 4])
def test_append_matches_csr_and_slot_mapping_bit_for_bit(rng, target, layout, P):
    tables, seq_lens = _tables(rng, P)
    q_lens = np.minimum(seq_lens, rng.integers(0, 6, seq_lens.size)).astype(np.int32)
    qsl = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    T = int(qsl[-1]) + 2                                   # two padding rows, not written
    key = rng.standard_normal((T, H, D)).astype(np.float32)
    value = rng.standard_normal((T, H, D)).astype(np.float32)
    cache = _cache(rng, P, layout)
    by_tables = cache.copy()
    append_kv_with_block_tables(key, value, by_tables, tables, seq_lens, qsl, layout)
    by_csr = cache.copy()
    indptr, indices, last = block_tables_to_csr(tables, seq_lens, P)
    batch, pos = get_batch_indices_positions(qsl, seq_lens, T)
    append_paged_kv_cache(key, value, batch, pos, (by_csr[0], by_csr[1]), indices, indptr, last,
                          layout)
    by_slots = cache.copy()                                # slots straight from the tables
    slots = np.full(T, -1, np.int64)
    for b in range(seq_lens.size):
        for j in range(q_lens[b]):
            p = seq_lens[b] - q_lens[b] + j
            slots[qsl[b] + j] = tables[b, p // P] * P + p % P
    reshape_and_cache(key, value, by_slots[0], by_slots[1], slots, layout)
    by_pair = (cache[0].copy(), cache[1].copy())           # separate K/V caches
    append_kv_with_block_tables(key, value, by_pair, tables, seq_lens, qsl, layout)
    assert by_tables.tobytes() == by_csr.tobytes() == by_slots.tobytes()
    assert np.stack(by_pair).tobytes() == by_tables.tobytes()
    assert q_lens.sum() == 0 or by_tables.tobytes() != cache.tobytes()


@pytest.mark.parametrize("layout", ["HND", "NHD"])
def test_attention_matches_csr_entries(rng, target, layout):
    P = 4
    tables, seq_lens = _tables(rng, P)
    seq_lens = np.maximum(seq_lens, 1).astype(np.int32)
    cache = _cache(rng, P, layout).astype(ml_dtypes.bfloat16)
    pair = (cache[0], cache[1])
    indptr, indices, last = block_tables_to_csr(tables, seq_lens, P)
    B = seq_lens.size
    q = rng.standard_normal((B, 4, D)).astype(ml_dtypes.bfloat16)
    got = attention_with_block_tables(q, cache, tables, seq_lens, kv_layout=layout,
                                      logits_soft_cap=3.0)
    want = batch_decode(q, pair, indptr, indices, last, layout, logits_soft_cap=3.0)
    assert np.array_equal(got.view(np.uint16), want.view(np.uint16))
    separate = attention_with_block_tables(q, (cache[0].copy(), cache[1].copy()), tables, seq_lens,
                                           kv_layout=layout, logits_soft_cap=3.0)
    assert np.array_equal(separate.view(np.uint16), want.view(np.uint16))
    q_lens = np.minimum(seq_lens, rng.integers(1, 5, B)).astype(np.int32)
    qsl = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    qp = rng.standard_normal((int(qsl[-1]), 4, D)).astype(ml_dtypes.bfloat16)
    got = attention_with_block_tables(qp, cache, tables, seq_lens, qsl, layout, window_left=5)
    want = batch_prefill(qp, pair, qsl, indptr, indices, last, layout, causal=True, window_left=5)
    assert np.array_equal(got.view(np.uint16), want.view(np.uint16))
    ref = batch_prefill_ref(qp, pair, qsl, indptr, indices, last, layout, causal=True,
                            window_left=5)
    assert np.abs(got.astype(np.float32) - ref).max() < 2e-2


def test_fused_write_through_block_tables_equals_append_then_attend(rng, target):
    P, layout = 4, "HND"
    tables, seq_lens = _tables(rng, P)
    seq_lens = np.maximum(seq_lens, 3).astype(np.int32)
    q_lens = np.full(seq_lens.size, 3, np.int32)
    qsl = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    k, v = (rng.standard_normal((int(qsl[-1]), H, D)).astype(np.float32) for _ in range(2))
    q = rng.standard_normal((int(qsl[-1]), 2, D)).astype(np.float32)
    cache = _cache(rng, P, layout)
    fused = cache.copy()
    out = attention_with_block_tables(q, fused, tables, seq_lens, qsl, layout, append_key=k,
                                      append_value=v)
    apart = cache.copy()
    append_kv_with_block_tables(k, v, apart, tables, seq_lens, qsl, layout)
    want = attention_with_block_tables(q, apart, tables, seq_lens, qsl, layout)
    assert fused.tobytes() == apart.tobytes()
    assert np.array_equal(out, want)


@pytest.mark.parametrize("tables,seq_lens,match", [
    (np.array([[0], [1]], np.int32), np.array([0, -2], np.int32), r"seq_lens\[1\]=-2"),
    (np.array([[0, 1], [2, 3]], np.int32), np.array([8, 9], np.int32), r"seq_lens\[1\]=9 needs 3"),
    (np.array([[0, -1, 2]], np.int32), np.array([9], np.int32), r"block_tables\[0, 1\]=-1"),
    (np.array([[0, 1]], np.int32), np.array([9], np.int32), "needs 3 blocks"),
    (np.array([[0, 1]], np.int32), np.array([-1], np.int32), r"seq_lens\[0\]=-1"),
    (np.array([[0, 1]], np.int64), np.array([1], np.int32), "2-D int32"),
    (np.array([[0, 1]], np.int32), np.array([1], np.int64), "seq_lens dtype"),
])
def test_bad_block_tables_are_refused_by_name(tables, seq_lens, match):
    with pytest.raises((ValueError, TypeError), match=match):
        block_tables_to_csr(tables, seq_lens, 4)


def test_bad_cache_form_and_nothing_written(rng):
    cache = _cache(rng, 4, "HND")
    with pytest.raises(ValueError, match=r"\(2, N, H, P, D\)"):
        attention_with_block_tables(np.zeros((1, 2, D), np.float32), cache[0],
                                    np.zeros((1, 1), np.int32), np.ones(1, np.int32))
    before = cache.copy()
    tables = np.array([[3, -1]], np.int32)
    k = np.ones((2, H, D), np.float32)
    with pytest.raises(ValueError, match=r"block_tables\[0, 1\]=-1"):   # 6 tokens, one page listed
        append_kv_with_block_tables(k, k, cache, tables, np.array([6], np.int32),
                                    np.array([0, 2], np.int32))
    assert cache.tobytes() == before.tobytes()


def test_conversions_keep_int32_and_empty_or_full_requests():
    tables = np.array([[3, 4], [-1, -1], [5, -1]], np.int32)
    seq_lens = np.array([8, 0, 1], np.int32)               # one request fills both columns
    indptr, indices, last = block_tables_to_csr(tables, seq_lens, 4)
    assert indptr.tolist() == [0, 2, 2, 3] and indices.tolist() == [3, 4, 5]
    assert last.tolist() == [4, 0, 1]
    assert {a.dtype for a in (indptr, indices, last)} == {np.dtype(np.int32)}
    back, lens = csr_to_block_tables(indptr, indices, last, 4)          # width = longest
    assert back.tolist() == tables.tolist() and lens.tolist() == seq_lens.tolist()
    assert back.dtype == np.int32 and lens.dtype == np.int32
    empty, lens0 = csr_to_block_tables(np.zeros(1, np.int32), np.zeros(0, np.int32),
                                       np.zeros(0, np.int32), 4)           # no requests at all
    assert empty.shape == (0, 0) and lens0.shape == (0,)
    none, zero = csr_to_block_tables(np.zeros(2, np.int32), np.zeros(0, np.int32),
                                     np.zeros(1, np.int32), 4)
    assert none.shape == (1, 0) and zero.tolist() == [0]


@pytest.mark.parametrize("args,error,match", [
    ((np.array([0, 2], np.int64), np.array([1, 2], np.int32), np.array([3], np.int32)),
     TypeError, "kv_indptr dtype"),
    ((np.array([0, 2], np.int32), np.array([1, 2], np.int32), np.array([3, 1], np.int32)),
     ValueError, "kv_last_page_len has 2 entries, expected 1"),
    ((np.array([0, 1, 3], np.int32), np.array([1, 2], np.int32), np.array([3, 1], np.int32)),
     ValueError, r"kv_indices has 2 entries but kv_indptr\[-1\]=3"),
    ((np.array([0, 2], np.int32), np.array([1, 2], np.int32), np.array([3], np.int32)[None]),
     ValueError, "kv_last_page_len must be 1-D"),
    ((np.array([0, 2], np.int32), np.array([[1, 2]], np.int32), np.array([3], np.int32)),
     ValueError, "kv_indices must be 1-D"),
    ((np.array([1, 2], np.int32), np.array([1, 2], np.int32), np.array([3], np.int32)),
     ValueError, r"kv_indptr\[0\]=1 must be 0"),
])
def test_bad_csr_is_refused_by_name(args, error, match):
    with pytest.raises(error, match=match):
        csr_to_block_tables(*args, 4)


def test_max_blocks_smaller_than_a_request_is_refused():
    indptr = np.array([0, 2, 5], np.int32)                 # request 0 fits exactly, 1 does not
    with pytest.raises(ValueError, match="request 1 has 3 pages but max_blocks=2"):
        csr_to_block_tables(indptr, np.arange(5, dtype=np.int32), np.array([1, 2], np.int32), 4,
                            max_blocks=2)


@pytest.mark.parametrize("pair", [(np.zeros((N, H, 4, D)),) * 3, (np.zeros((N, H, 4, D)), 1),
                                  (np.zeros((N, H, 4, D)), np.zeros((2, N, H, 4, D)))])
def test_bad_pairs_refused(pair):
    with pytest.raises(ValueError, match=r"kv_cache pair must be \(k_cache, v_cache\)"):
        attention_with_block_tables(np.zeros((1, 2, D), np.float32), pair,
                                    np.zeros((1, 1), np.int32), np.ones(1, np.int32))


@pytest.mark.parametrize("page_size, error, rule", [(0, ValueError, "page_size=0 must be >= 1"),
                                                    (2.0, TypeError, "must be an integer"),
                                                    (None, TypeError, "must be an integer"),
                                                    (True, TypeError, "must be an integer")])
def test_bad_page_size(page_size, error, rule):
    with pytest.raises(error, match=rule):
        block_tables_to_csr(np.zeros((1, 1), np.int32), np.ones(1, np.int32), page_size)


def test_block_tables_message_names_shape_and_dtype():
    with pytest.raises(TypeError, match=r"got int64 \(1, 2\)"):
        block_tables_to_csr(np.zeros((1, 2), np.int64), np.ones(1, np.int32), 4)
    with pytest.raises(TypeError, match="got list"):
        block_tables_to_csr([[0, 1]], np.ones(1, np.int32), 4)
    with pytest.raises(ValueError, match="seq_lens has 2 entries, expected 1"):
        block_tables_to_csr(np.zeros((1, 2), np.int32), np.ones(2, np.int32), 4)


@pytest.mark.parametrize("cache", [np.zeros((3, N, H, 4, D), np.float32),
                                   np.zeros((2, N, H, 4), np.float32), [np.zeros(3)] * 3])
def test_cache_forms_refused(cache):
    tables, lens = np.zeros((1, 1), np.int32), np.ones(1, np.int32)
    with pytest.raises(ValueError, match=r"kv_cache shape .* must be \(2, N, H, P, D\)|"
                                         r"kv_cache pair must be \(k_cache, v_cache\)"):
        attention_with_block_tables(np.zeros((1, 2, D), np.float32), cache, tables, lens)


@pytest.mark.parametrize("qsl,error,match", [
    (np.array([0, 2], np.int32), ValueError, "query_start_loc has 2 entries, expected 3"),
    (np.array([0, 2, 1], np.int32), ValueError, "query_start_loc must be non-decreasing"),
    (np.array([0, 1, 2], np.int64), TypeError, "query_start_loc dtype"),
])
def test_bad_query_start_loc_refused(rng, qsl, error, match):
    cache = _cache(rng, 4, "HND")
    k = np.zeros((2, H, D), np.float32)
    with pytest.raises(error, match=match):
        append_kv_with_block_tables(k, k, cache, np.array([[0], [1]], np.int32),
                                    np.array([1, 1], np.int32), qsl)


def test_default_layout_is_hnd_and_spare_page_reaches_the_append(rng, target):
    """The stacks' form is HND by default; padding rows go to the spare page when given."""
    cache = _cache(rng, 4, "HND")
    k = rng.standard_normal((3, H, D)).astype(np.float32)
    tables = np.array([[2, -1]], np.int32)
    qsl = np.array([0, 2], np.int32)                       # row 2 is padding
    written = cache.copy()
    append_kv_with_block_tables(k, k, written, tables, np.array([2], np.int32), qsl,
                                spare_page=7)
    assert np.array_equal(written[0, 2, :, :2].transpose(1, 0, 2), k[:2])
    assert not np.array_equal(written[0, 7], cache[0, 7])            # the padding row landed there
    out = attention_with_block_tables(np.ones((1, 2, D), np.float32), written, tables,
                                      np.array([2], np.int32))
    want = attention_with_block_tables(np.ones((1, 2, D), np.float32), written, tables,
                                       np.array([2], np.int32), kv_layout="HND")
    assert np.array_equal(out, want)


def test_block_table_references_match_the_entries(rng, target):
    P = 4
    tables, seq_lens = _tables(rng, P)
    q_lens = np.minimum(seq_lens, rng.integers(0, 4, seq_lens.size)).astype(np.int32)
    qsl = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    key = rng.standard_normal((int(qsl[-1]), H, D)).astype(np.float32)
    cache = _cache(rng, P, "HND")
    want = append_kv_with_block_tables_ref(key, -key, cache, tables, seq_lens, qsl)
    append_kv_with_block_tables(key, -key, cache, tables, seq_lens, qsl)
    assert np.array_equal(cache, want)
    q = rng.standard_normal((int(qsl[-1]), 2 * H, D)).astype(np.float32)
    ref = attention_with_block_tables_ref(q, cache, tables, seq_lens, qsl)
    np.testing.assert_allclose(attention_with_block_tables(q, cache, tables, seq_lens, qsl),
                               ref, atol=2e-5, rtol=2e-5)


def test_reshape_and_cache_reference(rng, target):
    from nki_kernels.paged_kv_append import reshape_and_cache_ref
    k_cache, v_cache = (rng.standard_normal((N, 4, H, D)).astype(np.float32) for _ in range(2))
    slots = np.array([5, -1, 17, 0], np.int64)
    key = rng.standard_normal((4, H, D)).astype(np.float32)
    want_k, want_v = reshape_and_cache_ref(key, -key, k_cache, v_cache, slots)
    reshape_and_cache(key, -key, k_cache, v_cache, slots)
    assert np.array_equal(k_cache, want_k) and np.array_equal(v_cache, want_v)
    assert np.array_equal(want_k[1, 1], key[0]) and np.array_equal(want_v[4, 1], -key[2])
