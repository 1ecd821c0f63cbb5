"""Bad input to batch_decode is refused with the argument and the rule."""

import numpy as np
import pytest

from nki_kernels.paged_attention import batch_decode

from .conftest import make_decode_case


@pytest.fixture
def args(rng):
    return make_decode_case(rng, [10, 3], 4, 2, 2, 8)


@pytest.mark.parametrize("change, match", [
    (dict(q=np.zeros((2, 3, 8), np.float32)), "num_qo_heads=3 must be a multiple of num_kv_heads=2"),
    (dict(q=np.zeros((2, 4, 16), np.float32)), "q head_dim 16 != cache head_dim 8"),
    (dict(kv_indptr=np.array([0, 3, 9], np.int32)), "exceeds len"),
    (dict(kv_indptr=np.array([0, 3, 4], np.int64)), "must be int32"),
    (dict(kv_last_page_len=np.array([5, 3], np.int32)), r"kv_last_page_len\[0\]=5 must be in \[1, page_size=4\]"),
    (dict(window_left=-2), "window_left=-2"),
    (dict(logits_soft_cap=-1.0), "logits_soft_cap=-1.0"),
    (dict(sm_scale=0.0), "sm_scale=0.0"),
    (dict(sinks=np.zeros(3, np.float32)), "sinks must be an array of shape"),
    (dict(kv_layout="NDH"), "kv_layout='NDH'"),
])
def test_refused(args, change, match):
    names = ["q", "paged_kv_cache", "kv_indptr", "kv_indices", "kv_last_page_len", "kv_layout"]
    kwargs = dict(zip(names, args))
    kwargs.update(change)
    with pytest.raises((ValueError, TypeError), match=match):
        batch_decode(**kwargs)
