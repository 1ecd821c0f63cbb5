"""PagedKVCache: pages allocated and freed per request, page table consistent with the data."""

import numpy as np
import pytest

from nki_kernels.paged_kv_append import OutOfPages, PagedKVCache
from nki_kernels.paged_cache.layout import split_cache


def test_allocate_append_free_cycle(rng, target):
    cache = PagedKVCache(num_pages=8, page_size=4, num_kv_heads=2, head_dim=3, fill=np.nan)
    for r in "abc":
        cache.add_request(r)
    k = rng.standard_normal((11, 2, 3)).astype(np.float32)
    cache.append(["a", "b", "c"], k, -k, append_lens=[5, 1, 5])
    kv_indptr, kv_indices, last = cache.page_table(["a", "b", "c"])
    # 5 tokens -> 2 pages (4 + 1), 1 -> 1 page, 5 -> 2 pages
    assert kv_indptr.tolist() == [0, 2, 3, 5] and last.tolist() == [1, 1, 1]
    assert len(set(kv_indices.tolist())) == 5 and cache.num_free_pages == 3
    kd, vd, _ = split_cache(cache.data)
    for r, rows in (("a", k[:5]), ("c", k[6:])):
        pages = cache.pages(r)
        got = np.concatenate([kd[p] for p in pages])[:5]
        np.testing.assert_array_equal(got, rows)
    cache.append(["b"], k[:3], k[:3], append_lens=[3])          # decode/chunk onto b: 1 + 3 = 4
    assert cache.seq_len("b") == 4 and len(cache.pages("b")) == 1
    cache.free_request("a")
    assert cache.num_free_pages == 5
    cache.add_request("d")
    cache.reserve(["d"], 20)                                     # 5 pages
    assert cache.num_free_pages == 0
    with pytest.raises(OutOfPages, match="need 1 pages, 0 free"):
        cache.reserve(["b"], 1)
    assert cache.seq_len("b") == 4                               # nothing reserved


def test_hnd_pair_layout(rng):
    cache = PagedKVCache(4, 2, 3, 2, kv_layout="HND", fused=False)
    cache.add_request(0)
    k = rng.standard_normal((3, 3, 2)).astype(np.float32)
    cache.append([0], k, k * 2, append_lens=[3])
    pages = cache.pages(0)
    np.testing.assert_array_equal(cache.data[0][pages[1], :, 0], k[2])
    np.testing.assert_array_equal(cache.data[1][pages[0], :, 1], 2 * k[1])


def test_truncate_returns_pages_past_the_kept_tokens():
    cache = PagedKVCache(num_pages=8, page_size=4, num_kv_heads=1, head_dim=2)
    cache.add_request("a")
    cache.reserve(["a"], 10)                       # 3 pages
    pages = cache.pages("a")
    cache.truncate("a", 5)                         # 2 pages kept, the third freed
    assert cache.seq_len("a") == 5 and cache.pages("a") == pages[:2]
    assert cache.num_free_pages == 6
    _, _, last = cache.page_table(["a"])
    assert last.tolist() == [1]
    cache.truncate("a", 0)
    assert cache.pages("a") == [] and cache.num_free_pages == 8
    for bad, error in ((-1, ValueError), (1, ValueError), (2.0, TypeError), (True, TypeError)):
        with pytest.raises(error, match="new_len"):
            cache.truncate("a", bad)
    with pytest.raises(KeyError, match="'b'"):
        cache.truncate("b", 0)
