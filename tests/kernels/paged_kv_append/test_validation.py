"""Bad input is refused with a clear error before anything is written."""

import numpy as np
import pytest

from nki_kernels.paged_kv_append import append_paged_kv_cache, reshape_and_cache

from .conftest import bits


def mutate(args, i, value):
    args = list(args)
    args[i] = value
    return tuple(args)


@pytest.fixture
def good(case):
    return case([20, 9], [4, 9], 8, 2, 4)


CASES = [
    (lambda a: mutate(a, 2, a[2].astype(np.int64)), TypeError, "batch_indices dtype int64 must be int32"),
    (lambda a: mutate(a, 6, a[6].astype(np.int64)), TypeError, "kv_indptr dtype int64"),
    (lambda a: mutate(a, 7, np.array([0, 1], np.int32)), ValueError, r"kv_last_page_len\[0\]=0 must be in \[1, page_size=8\]"),
    (lambda a: mutate(a, 7, np.array([4, 9], np.int32)), ValueError, r"kv_last_page_len\[1\]=9 must be in \[1, page_size=8\]"),
    (lambda a: mutate(a, 5, np.where(np.arange(5) == 2, 99, a[5]).astype(np.int32)), ValueError, r"kv_indices\[2\]=99 is not a page"),
    (lambda a: mutate(a, 3, np.where(np.arange(13) == 0, 20, a[3]).astype(np.int32)), ValueError,
     r"positions\[0\]=20 is outside request 0's KV length 20"),
    (lambda a: mutate(a, 2, np.where(np.arange(13) == 5, 2, a[2]).astype(np.int32)), ValueError,
     r"batch_indices\[5\]=2 is not a request index"),
    (lambda a: mutate(a, 0, a[0][:, :1]), ValueError, "append_key shape"),
    (lambda a: mutate(a, 1, a[1].astype(np.float16)), TypeError, "append_value dtype float16"),
    (lambda a: mutate(a, 8, "NCHW"), ValueError, "kv_layout='NCHW'"),
    (lambda a: mutate(a, 3, np.where(np.arange(13) == 1, a[3][0], a[3]).astype(np.int32)), ValueError,
     "same cache slot"),
]


@pytest.mark.parametrize("make, exc, match", CASES, ids=lambda x: str(x)[:30])
def test_refused_and_nothing_written(good, make, exc, match):
    args = make(good)
    before = bits(good[4]).copy()
    with pytest.raises(exc, match=match):
        append_paged_kv_cache(*args)
    np.testing.assert_array_equal(bits(good[4]), before)


def test_reshape_and_cache_refuses_out_of_range_and_duplicates():
    kc = np.zeros((2, 4, 1, 2), np.float32)
    vc = kc.copy()
    kv = np.ones((2, 1, 2), np.float32)
    with pytest.raises(ValueError, match=r"slot_mapping\[1\]=8 exceeds the cache's 8 slots"):
        reshape_and_cache(kv, kv, kc, vc, np.array([0, 8]))
    with pytest.raises(ValueError, match="same slot twice"):
        reshape_and_cache(kv, kv, kc, vc, np.array([3, 3]))
    assert not kc.any() and not vc.any()


def test_page_id_bounds_are_exact(case):
    """A page id equal to the page count is refused (it would be dropped by oob_mode.skip, not
    written); the last page id is accepted."""
    args = case([20, 9], [4, 9], 8, 2, 4)
    n = args[4].shape[0]
    used = int(args[6][-1])
    for page, ok in ((n, False), (n - 1, True)):
        indices = args[5].copy()
        others = np.flatnonzero(indices[:used] == n - 1)
        if others.size:                                  # keep page ids unique
            indices[others[0]] = indices[used - 1]
        indices[used - 1] = page
        fresh = list(args)
        fresh[4] = args[4].copy()
        fresh[5] = indices
        if ok:
            append_paged_kv_cache(*fresh)
        else:
            with pytest.raises(ValueError, match=rf"kv_indices\[{used - 1}\]={n} is not a page"):
                append_paged_kv_cache(*fresh)
