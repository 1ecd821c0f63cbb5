"""merge_state(s): attention over two disjoint KV parts, merged by base-2 LSE, equals the whole."""

import numpy as np

from nki_kernels.paged_attention import batch_decode, merge_state, merge_states

from .conftest import make_decode_case


def split_table(kv_indptr, kv_indices, kv_last_page_len, page_size):
    """Per request: first page alone (part a) and the remaining pages (part b)."""
    pages = np.diff(kv_indptr)
    a_ptr = np.concatenate([[0], np.cumsum(np.minimum(pages, 1))]).astype(np.int32)
    a_idx = np.array([kv_indices[kv_indptr[b]] for b in range(len(pages)) if pages[b]], np.int32)
    a_last = np.where(pages > 1, page_size, kv_last_page_len).astype(np.int32)
    rest = np.maximum(pages - 1, 0)
    b_ptr = np.concatenate([[0], np.cumsum(rest)]).astype(np.int32)
    b_idx = np.concatenate([kv_indices[kv_indptr[b] + 1:kv_indptr[b + 1]] for b in range(len(pages))]).astype(np.int32)
    b_last = np.where(pages > 1, kv_last_page_len, 0).astype(np.int32)
    return (a_ptr, a_idx, a_last), (b_ptr, b_idx, b_last)


def test_merging_two_parts_gives_the_whole(rng):
    q, cache, ptr, idx, last, layout = make_decode_case(rng, [40, 9, 3], 8, 2, 2, 16)
    whole, whole_lse = batch_decode(q, cache, ptr, idx, last, layout, return_lse=True)
    (pa, ia, la), (pb, ib, lb) = split_table(ptr, idx, last, 8)
    va, sa = batch_decode(q, cache, pa, ia, la, layout, return_lse=True)
    vb, sb = batch_decode(q, cache, pb, ib, lb, layout, return_lse=True)   # request 2: empty part
    v, s = merge_state(va, sa, vb, sb)
    np.testing.assert_allclose(v, whole, atol=2e-6)
    np.testing.assert_allclose(s, whole_lse, atol=2e-5)
    v3, s3 = merge_states(np.stack([va, vb, np.zeros_like(va)], axis=2),
                          np.stack([sa, sb, np.full_like(sa, -np.inf)], axis=2))
    np.testing.assert_allclose(v3, whole, atol=2e-6)


def test_merge_hand_computed():
    # parts with LSE 1 and 3 (base 2): weights 2/(2+8) and 8/(2+8); merged LSE log2(10)
    v, s = merge_state(np.array([[1.0]]), np.array(1.0), np.array([[6.0]]), np.array(3.0))
    np.testing.assert_allclose(v, [[0.2 * 1 + 0.8 * 6]], rtol=1e-6)
    np.testing.assert_allclose(s, np.log2(10.0), rtol=1e-6)
    v, s = merge_state(np.zeros((1, 2)), np.array(-np.inf), np.zeros((1, 2)), np.array(-np.inf))
    assert not v.any() and np.isneginf(s)
