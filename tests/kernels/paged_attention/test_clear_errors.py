"""Bad or unusual decode inputs get a clear error naming the argument and the rule (or, when
valid, a result): the cases an adversarial fuzzer found reaching NumPy or simulator internals."""

import numpy as np
import pytest

from nki_kernels.paged_attention import (batch_decode, batch_decode_ref, merge_state,
                                                merge_states)

IP, IDX, LAST = np.array([0, 1], np.int32), np.array([0], np.int32), np.array([5], np.int32)


def _cache(rng, H=2, D=8, dtype=np.float32):
    return rng.standard_normal((4, 2, 16, H, D)).astype(dtype)


def _q(rng, HQ=4, D=8):
    return rng.standard_normal((1, HQ, D)).astype(np.float32)


@pytest.mark.parametrize("kw, match", [
    (dict(sm_scale="0.1"), "sm_scale='0.1' must be a real number"),
    (dict(logits_soft_cap="2"), "logits_soft_cap='2' must be a real number"),
    (dict(k_scale=None), "k_scale=None must be a real number"),
])
def test_non_numeric_scalars_name_the_argument(rng, kw, match):
    with pytest.raises(TypeError, match=match):
        batch_decode(_q(rng), _cache(rng), IP, IDX, LAST, **kw)


def test_soft_cap_none_means_no_cap_as_in_flashinfer(rng, target):
    q, cache = _q(rng), _cache(rng)
    got = batch_decode(q, cache, IP, IDX, LAST, logits_soft_cap=None)
    np.testing.assert_allclose(got, batch_decode_ref(q, cache, IP, IDX, LAST), atol=2e-5)


def test_group_and_head_dim_limits_are_checked_up_front(rng):
    with pytest.raises(ValueError, match="group must fit the 128 partitions"):
        batch_decode(_q(rng, HQ=258), _cache(rng), IP, IDX, LAST)
    with pytest.raises(ValueError, match="head_dim=520 exceeds 512"):
        batch_decode(_q(rng, HQ=2, D=520), _cache(rng, D=520), IP, IDX, LAST)


def test_float64_cache_is_named_as_the_cache(rng):
    with pytest.raises(TypeError, match="cache dtype float64"):
        batch_decode(_q(rng), _cache(rng, dtype=np.float64), IP, IDX, LAST)


def test_empty_batch_returns_empty_outputs(rng, target):
    out, lse = batch_decode(np.zeros((0, 4, 8), np.float32), _cache(rng), np.zeros(1, np.int32),
                            np.zeros(0, np.int32), np.zeros(0, np.int32), return_lse=True)
    assert out.shape == (0, 4, 8) and lse.shape == (0, 4)


def test_merge_states_propagates_nan_instead_of_dropping_the_valid_part():
    v = np.ones((2, 3, 4), np.float32)
    s = np.zeros((2, 3), np.float32)
    s[0, 0] = np.nan
    out, lse = merge_states(v, s)
    assert np.isnan(out[0]).all() and np.isnan(lse[0])
    np.testing.assert_allclose(out[1], 1.0)
    np.testing.assert_allclose(lse[1], np.log2(3.0), rtol=1e-6)


def test_merge_shape_mismatch_names_the_rule():
    with pytest.raises(ValueError, match="s shape \\(3, 3\\) must match"):
        merge_states(np.ones((2, 3, 4)), np.zeros((3, 3)))
    with pytest.raises(ValueError, match="must match pairwise"):
        merge_state(np.ones((2, 4)), np.zeros(2), np.ones((3, 4)), np.zeros(3))
