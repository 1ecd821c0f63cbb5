import numpy as np
import pytest

from nki_kernels.paged_kv_append import get_batch_indices_positions


def bits(a):
    if isinstance(a, tuple):
        return tuple(bits(x) for x in a)
    return np.ascontiguousarray(a).view(np.uint8)


def assert_bits_equal(a, b):
    if isinstance(a, tuple):
        for x, y in zip(a, b):
            assert_bits_equal(x, y)
        return
    np.testing.assert_array_equal(bits(a), bits(b))


def make_append_case(rng, kv_lens, append_lens, page_size, H, D, dtype=np.float32, layout="NHD",
                     fused=True, spare_pages=3):
    """A NaN-filled cache with a shuffled page table: request b owns ceil(kv_len/P) pages and
    appends its last append_lens[b] tokens. Returns (args tuple for append_paged_kv_cache, cache)."""
    kv_lens, append_lens = np.asarray(kv_lens), np.asarray(append_lens)
    pages_per = -(-kv_lens // page_size)
    num_pages = int(pages_per.sum()) + spare_pages
    perm = rng.permutation(num_pages).astype(np.int32)
    kv_indptr = np.concatenate([[0], np.cumsum(pages_per)]).astype(np.int32)
    kv_indices = perm[:kv_indptr[-1]]
    last = np.where(kv_lens > 0, (kv_lens - 1) % page_size + 1, 0).astype(np.int32)
    inner = (page_size, H, D) if layout == "NHD" else (H, page_size, D)
    nan = np.full((num_pages, 2) + inner, np.nan, np.float32).astype(dtype)
    cache = nan if fused else (nan[:, 0].copy(), nan[:, 1].copy())
    nnz = int(append_lens.sum())
    append_indptr = np.concatenate([[0], np.cumsum(append_lens)]).astype(np.int32)
    batch, positions = get_batch_indices_positions(append_indptr, kv_lens.astype(np.int32), nnz)
    k = rng.standard_normal((nnz, H, D)).astype(dtype)
    v = rng.standard_normal((nnz, H, D)).astype(dtype)
    return (k, v, batch, positions, cache, kv_indices, kv_indptr, last, layout)


@pytest.fixture
def case(rng):
    return lambda *a, **k: make_append_case(rng, *a, **k)
