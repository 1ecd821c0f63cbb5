"""batch_decode's host checks one rule at a time, without the simulator: each refusal names the
argument it is about, each limit is accepted at its boundary and refused one past it, and the
problem returned carries the values the kernel is planned from."""

import numpy as np
import pytest

from nki_kernels.paged_attention.checks import (MAX_GROUP, MAX_HEAD_DIM,
                                                       check_batch_decode_inputs)


def case(B=2, H=2, G=4, D=16, P=4, pages=6, dtype=np.float32):
    """Valid inputs: a fused NHD cache, request b owning pages 2b, 2b+1 (7 tokens each)."""
    return dict(q=np.zeros((B, H * G, D), dtype), paged_kv_cache=np.zeros((pages, 2, P, H, D), dtype),
                kv_indptr=np.arange(0, 2 * B + 1, 2, dtype=np.int32),
                kv_indices=np.arange(2 * B, dtype=np.int32),
                kv_last_page_len=np.full(B, 3, np.int32), kv_layout="NHD", sm_scale=None,
                logits_soft_cap=0.0, window_left=-1, sinks=None, k_scale=1.0, v_scale=1.0)


def check(**changes):
    args = case()
    args.update(changes)
    return check_batch_decode_inputs(**args)


def test_valid_problem_carries_its_values():
    p = check_batch_decode_inputs(**case(B=3, H=2, G=5, D=16))
    assert (p.batch, p.num_qo_heads, p.group) == (3, 10, 5)
    assert p.kv_lens.tolist() == [7, 7, 7]
    assert p.sm_scale == pytest.approx(1 / 4)                  # 1 / sqrt(head_dim)
    assert check(sm_scale=0.5).sm_scale == 0.5
    assert check(batch=2).batch == 2


@pytest.mark.parametrize("q, match", [
    (np.zeros((2, 8), np.float32), r"q must be a 3-D array .* got \(2, 8\)"),
    ([[[0.0]]], "q must be a 3-D array .* got list"),
])
def test_q_shape(q, match):
    with pytest.raises(ValueError, match=match):
        check(q=q)


def test_dtypes_are_named():
    with pytest.raises(TypeError, match="q dtype int32 must be one of"):
        check(q=np.zeros((2, 8, 16), np.int32))
    args = case()
    args["paged_kv_cache"] = args["paged_kv_cache"].astype(np.int16)
    with pytest.raises(TypeError, match="cache dtype int16 must be one of"):
        check_batch_decode_inputs(**args)


def test_group_limit_boundary():
    p = check_batch_decode_inputs(**case(B=1, H=1, G=MAX_GROUP, D=8))
    assert p.group == MAX_GROUP
    with pytest.raises(ValueError, match=f"num_qo_heads / num_kv_heads = {MAX_GROUP + 1}: "):
        check_batch_decode_inputs(**case(B=1, H=1, G=MAX_GROUP + 1, D=8))
    with pytest.raises(ValueError, match="num_qo_heads=7 must be a multiple of num_kv_heads=2"):
        check(q=np.zeros((2, 7, 16), np.float32))


def test_head_dim_limit_boundary():
    assert check_batch_decode_inputs(**case(B=1, H=1, G=1, D=MAX_HEAD_DIM, pages=2)).batch == 1
    with pytest.raises(ValueError, match=f"head_dim={MAX_HEAD_DIM + 1} exceeds {MAX_HEAD_DIM}"):
        check_batch_decode_inputs(**case(B=1, H=1, G=1, D=MAX_HEAD_DIM + 1, pages=2))
    with pytest.raises(ValueError, match="q head_dim 8 != cache head_dim 16"):
        check(q=np.zeros((2, 8, 8), np.float32))


@pytest.mark.parametrize("name, value", [
    ("kv_indptr", np.array([0, 2], np.int32)),                  # one entry short
    ("kv_indptr", np.array([0, 2, 4], np.int64)),
    ("kv_indices", np.array([0, 1, 2, 3], np.float32)),
    ("kv_last_page_len", np.array([3], np.int32)),
    ("kv_last_page_len", np.array([3, 3], np.int64)),
])
def test_table_arguments_are_named(name, value):
    with pytest.raises((TypeError, ValueError), match=name):
        check(**{name: value})


@pytest.mark.parametrize("name", ["sm_scale", "logits_soft_cap", "k_scale", "v_scale"])
def test_scalars_must_be_real_numbers(name):
    with pytest.raises(TypeError, match=f"{name}='0.1' must be a real number, got str"):
        check(**{name: "0.1"})
    with pytest.raises(TypeError, match=f"{name}=True must be a real number"):
        check(**{name: True})


@pytest.mark.parametrize("name", ["sm_scale", "k_scale", "v_scale"])
@pytest.mark.parametrize("value", [0.0, -1.0, np.inf, np.nan])
def test_scales_must_be_positive_and_finite(name, value):
    with pytest.raises(ValueError, match=f"{name}={value} must be a positive finite number"):
        check(**{name: value})


def test_soft_cap_and_window():
    assert check(logits_soft_cap=0.0).batch == 2
    with pytest.raises(ValueError, match="logits_soft_cap=-1.0 must be >= 0"):
        check(logits_soft_cap=-1.0)
    with pytest.raises(ValueError, match="logits_soft_cap=inf must be >= 0"):
        check(logits_soft_cap=np.inf)
    assert check(window_left=-1).batch == check(window_left=0).batch == 2
    for bad in (-2, 1.5):
        with pytest.raises(ValueError, match=f"window_left={bad} must be an integer >= -1"):
            check(window_left=bad)


def test_sinks():
    assert check(sinks=np.zeros(8, np.float32)).num_qo_heads == 8
    for bad in (np.zeros(7, np.float32), list(np.zeros(8))):
        with pytest.raises(ValueError, match=r"sinks must be an array of shape \(num_qo_heads,\) "
                                             r"= \(8,\)"):
            check(sinks=bad)
    for bad in (np.nan, np.inf):
        with pytest.raises(ValueError, match="^sinks must be finite$"):
            check(sinks=np.full(8, bad, np.float32))
