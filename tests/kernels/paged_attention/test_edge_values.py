"""Edge values of the attention entries: windows past int32, NaN and inf past the mask, on both
targets, and aliasing between the fused write and the inputs it reads (docs/numerics.md)."""

import numpy as np
import pytest

from nki_kernels.block_tables import attention_with_block_tables, csr_to_block_tables
from nki_kernels.paged_attention import batch_decode, batch_prefill, batch_prefill_ref
from nki_kernels.paged_attention.work import MAX_KV_LEN
from nki_kernels.paged_attention.reference import batch_decode_ref
from nki_kernels.paged_cache.layout import split_cache

from .conftest import assert_close, make_decode_case
from .test_prefill import make_prefill_case


@pytest.mark.parametrize("window", [2 ** 31 - 1, 2 ** 31, 2 ** 40, MAX_KV_LEN, 10 ** 30])
def test_any_window_past_the_sequence_is_no_window(rng, target, window):
    args = make_prefill_case(rng, [3, 7], [40, 7], 16, 2, 2, 16)
    want = batch_prefill_ref(*args, causal=True)
    assert_close(batch_prefill(*args, causal=True, window_left=window), want)
    assert_close(batch_prefill_ref(*args, causal=True, window_left=window), want)
    q, cache, kv_indptr, kv_indices, last, layout = make_decode_case(rng, [5, 40], 16, 2, 2, 16)
    assert_close(batch_decode(q, cache, kv_indptr, kv_indices, last, layout, window_left=window),
                 batch_decode_ref(q, cache, kv_indptr, kv_indices, last, layout))


def test_a_huge_window_through_block_tables(rng, target):
    q, cache, qo_indptr, kv_indptr, kv_indices, last, layout = make_prefill_case(
        rng, [4, 2], [20, 33], 4, 1, 2, 8, fused=False)
    tables, seq_lens = csr_to_block_tables(kv_indptr, kv_indices, last, 4)
    got = attention_with_block_tables(q, cache, tables, seq_lens, qo_indptr, layout,
                                      window_left=2 ** 31 - 1)
    assert_close(got, batch_prefill_ref(q, cache, qo_indptr, kv_indptr, kv_indices, last, layout,
                                        causal=True))


def test_more_keys_than_the_kernel_positions_hold_are_refused():
    cache = np.zeros((1, 2, 256, 1, 8), np.float32)
    pages = 2 ** 16 + 1                                      # one page, listed 65537 times
    with pytest.raises(ValueError, match=r"request 0 has 16777472 keys .* at most 16777215"):
        batch_decode(np.zeros((1, 1, 8), np.float32), cache, np.array([0, pages], np.int32),
                     np.zeros(pages, np.int32), np.array([256], np.int32))


def _kv_at(cache, kv_indptr, kv_indices, layout, b, pos):
    """(K cache, index) of request b's key at ``pos`` (head 0, element 0)."""
    k = split_cache(cache)[0]
    P = k.shape[1] if layout == "NHD" else k.shape[2]
    page, entry = kv_indices[kv_indptr[b] + pos // P], pos % P
    return k, ((page, entry, 0, 0) if layout == "NHD" else (page, 0, entry, 0))


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_a_key_only_later_queries_see_cannot_reach_earlier_ones(rng, bad, layout):
    """trn2: the masked score is selected away, so queries that do not see the key are exactly
    the reference's; a query that sees a NaN key is NaN as in the reference (and, as the
    score tile's per-head matmuls share zero-padded operands, so are the other kv heads of its
    tile: docs/numerics.md)."""
    from nki_kernels import simulate
    with simulate.use_target("trn2"):
        args = make_prefill_case(rng, [5, 9], [5, 40], 16, 2, 4, 32, layout=layout)
        k, at = _kv_at(args[1], args[3], args[4], layout, 1, 39)       # request 1's last key
        k[at] = bad
        out = batch_prefill(*args, causal=True)
        ref = batch_prefill_ref(*args, causal=True)
        earlier = np.r_[0:13]                                           # all but the last query
        assert np.isfinite(out[earlier]).all()
        assert_close(out[earlier], ref[earlier])
        if np.isnan(bad):
            assert np.isnan(out[13, :4]).all()     # (kv heads sharing its score tile too)


def test_trn1_a_nonfinite_key_stays_inside_its_chunk(rng):
    """trn1 (NeuronCore-v2, TensorE transposes are fp32 matmuls): a NaN key reaches the queries
    of its kv head that read its chunk (docs/numerics.md), never those of earlier chunks."""
    from nki_kernels import simulate
    with simulate.use_target("trn1"):
        args = make_prefill_case(rng, [300], [300], 16, 1, 2, 16)
        k, at = _kv_at(args[1], args[3], args[4], "NHD", 0, 290)
        k[at] = np.nan
        out = batch_prefill(*args, causal=True)
        ref = batch_prefill_ref(*args, causal=True)
        assert_close(out[:128], ref[:128])                              # chunk 0 only
        assert np.isnan(out[290:]).all()


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_a_nonfinite_query_element_reaches_only_its_own_head(rng, target, bad):
    q, cache, kv_indptr, kv_indices, last, layout = make_decode_case(rng, [20, 33], 16, 2, 4, 32)
    q[1, 5, 3] = bad
    out = batch_decode(q, cache, kv_indptr, kv_indices, last, layout)
    ref = batch_decode_ref(q, cache, kv_indptr, kv_indices, last, layout)
    assert np.isnan(out[1, 5]).all()
    keep = np.ones(out.shape[:2], bool)
    keep[1, 5] = False
    assert np.isfinite(out[keep]).all()
    assert_close(out[keep], ref[keep])
    args = list(make_prefill_case(rng, [6, 9], [6, 40], 16, 2, 4, 32))
    args[0][8, 2, 0] = bad
    out, lse = batch_prefill(*args, causal=True, return_lse=True)
    assert np.isnan(out[8, 2]).all() and np.isnan(lse[8, 2])
    keep = np.ones(out.shape[:2], bool)
    keep[8, 2] = False
    assert np.isfinite(out[keep]).all()
    assert_close(out[keep], batch_prefill_ref(*args, causal=True)[keep])


def test_sinks_viewing_the_cache_are_read_before_the_fused_write(rng, target):
    """sinks that view cache memory the fused write overwrites are read as they were."""
    q, cache, qo_indptr, kv_indptr, kv_indices, last, layout = make_prefill_case(
        rng, [3], [10], 4, 1, 2, 4)
    k = split_cache(cache)[0]
    page = kv_indices[2]                                       # holds keys 8, 9: written below
    sinks = k[page, 0, 0, 0:2]                                 # a view of key 8's K
    sinks[:] = [0.5, -0.25]
    expect_sinks = sinks.copy()
    new = rng.standard_normal((3, 1, 4)).astype(np.float32)
    got = batch_prefill(q, cache, qo_indptr, kv_indptr, kv_indices, last, layout, causal=True,
                        sinks=sinks, append_key=new, append_value=-new)
    want = batch_prefill_ref(q, cache, qo_indptr, kv_indptr, kv_indices, last, layout,
                             causal=True, sinks=expect_sinks)
    assert_close(got, want)


def test_mixed_batch_queries_viewing_the_cache_are_read_before_the_write(rng, target):
    """A mixed batch runs as two launches; q rows that view the cache are the values at the
    call, not what the first launch wrote."""
    H, G, D = 1, 1, 4
    _, cache, qo_indptr, kv_indptr, kv_indices, last, layout = make_prefill_case(
        rng, [1, 3], [6, 10], 4, H, G, D, fused=False)
    flat = cache[0].reshape(-1, H * G, D)        # [N, P, H, D]: one row per slot
    first = kv_indices[kv_indptr[1] + 7 // 4] * 4 + 7 % 4      # request 1's first new token
    q = flat[first:first + 4]               # the single query (row 0) views a written slot
    assert q.shape[0] == 4 and np.shares_memory(q, cache[0])
    q_at_call = q.copy()
    new = rng.standard_normal((4, H, D)).astype(np.float32) + 3.0
    got = batch_prefill(q, cache, qo_indptr, kv_indptr, kv_indices, last, layout, causal=True,
                        append_key=new, append_value=-new)
    want = batch_prefill_ref(q_at_call, cache, qo_indptr, kv_indptr, kv_indices, last, layout,
                             causal=True)
    assert_close(got, want)


@pytest.mark.parametrize("bad", [np.nan, np.inf])
@pytest.mark.parametrize("q_len", [1, 4])
def test_a_nonfinite_value_before_the_window_start_is_never_read(rng, target, bad, q_len):
    """A key and value before every query's window start, in the chunk the window starts in
    (gathered with it), are dropped from the gather: none of their bits reaches an output."""
    lens = [300, 200]
    args = make_prefill_case(rng, [q_len, q_len], lens, 16, 2, 4, 32)
    window = 38
    start = 300 - q_len - window             # request 0's first query's window start (chunk 2)
    bad_at = start - 2                       # still in chunk 2 (from 256), seen by no query
    for half in (0, 1):                      # its K and V
        cache = split_cache(args[1])[half]
        page, entry = args[4][args[3][0] + bad_at // 16], bad_at % 16
        cache[page, entry] = bad
    out = batch_prefill(*args, causal=True, window_left=window)
    ref = batch_prefill_ref(*args, causal=True, window_left=window)
    assert np.isfinite(out).all()
    assert_close(out, ref)
