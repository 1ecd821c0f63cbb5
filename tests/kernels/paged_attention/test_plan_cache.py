"""Plans reused across a step's layers (``plan_cache``): a later layer gets the first layer's plan
and its own right answer; anything that changes the plan (a table entry, an entry changed in
place, a planning constant, the target, q's shape) plans afresh and still refuses bad input;
a kept plan shares no memory with the caller and cannot be changed."""

import numpy as np
import pytest

from nki_kernels import simulate
from nki_kernels.paged_attention import (batch_decode, batch_decode_ref, batch_prefill,
                                         plan_cache, work)
from nki_kernels.paged_attention.plan import prepare_decode

from .conftest import assert_close, make_decode_case
from .test_prefill import check, make_prefill_case


@pytest.fixture(autouse=True)
def fresh_cache():
    plan_cache.clear()
    yield
    plan_cache.clear()


def _layer(rng, args):
    """The same step's metadata over another layer: new q, a cache of other contents."""
    q, cache, *rest = args
    return (rng.standard_normal(q.shape).astype(q.dtype),
            rng.standard_normal(cache.shape).astype(cache.dtype), *rest)


def test_later_layers_reuse_the_plan_and_get_their_own_answers(rng):
    args = make_prefill_case(rng, [5, 1, 9], [40, 17, 9], 16, 2, 4, 32)
    check(args)
    assert plan_cache.stats()["misses"] >= 1 and plan_cache.stats()["hits"] == 0
    made = plan_cache.stats()["misses"]
    for _ in range(2):
        check(_layer(rng, args))
    assert plan_cache.stats()["misses"] == made and plan_cache.stats()["hits"] == 2
    dec = make_decode_case(rng, [33, 7], 16, 2, 4, 32)
    assert_close(batch_decode(*dec), batch_decode_ref(*dec))
    other = _layer(rng, dec)
    assert_close(batch_decode(*other), batch_decode_ref(*other))
    assert plan_cache.stats()["hits"] == 3


def test_a_table_changed_in_place_is_a_new_plan(rng):
    q, cache, kv_indptr, kv_indices, last, layout = make_decode_case(rng, [33, 7], 16, 2, 4, 32)
    assert_close(batch_decode(q, cache, kv_indptr, kv_indices, last, layout),
                 batch_decode_ref(q, cache, kv_indptr, kv_indices, last, layout))
    kv_indices[[0, -1]] = kv_indices[[-1, 0]]          # the caller's array, changed in place
    last[1] -= 3
    out = batch_decode(q, cache, kv_indptr, kv_indices, last, layout)
    assert_close(out, batch_decode_ref(q, cache, kv_indptr, kv_indices, last, layout))
    assert plan_cache.stats()["hits"] == 0 and plan_cache.stats()["misses"] == 2


def test_a_changed_constant_or_target_is_a_new_plan(rng, monkeypatch):
    args = make_prefill_case(rng, [1, 1, 1], [70, 20, 5], 16, 2, 4, 32)
    check(args)
    monkeypatch.setattr(work, "STATIC_MAX_SLOTS", 0)      # the device loops, not a static pass
    check(args)
    with simulate.use_target("trn1"):
        check(args)
    assert plan_cache.stats()["hits"] == 0 and plan_cache.stats()["misses"] == 3
    from nki_kernels.paged_attention import plan
    seen = []
    real = plan.split_work
    monkeypatch.setattr(plan, "split_work", lambda *a, **k: seen.append(1) or real(*a, **k))
    long_args = make_prefill_case(rng, [9], [40], 16, 2, 4, 32)
    check(long_args)
    monkeypatch.setattr(plan, "split_work", lambda *a, **k: seen.append(2) or real(*a, **k))
    check(long_args)                                      # a replaced function: planned again
    assert seen == [1, 2]


def test_bad_input_is_refused_after_a_good_call(rng):
    args = make_decode_case(rng, [33, 7], 16, 2, 4, 32)
    batch_decode(*args)
    q = args[0][:, :5]                                    # 5 query heads over 2 kv heads
    with pytest.raises(ValueError, match="heads"):
        batch_decode(np.ascontiguousarray(q), *args[1:])
    bad_last = args[4].copy()
    bad_last[0] = 17                                      # more than a page of 16
    with pytest.raises(ValueError, match="kv_last_page_len"):
        batch_decode(*args[:4], bad_last, args[5])


def test_a_kept_plan_owns_read_only_arrays(rng):
    q, cache, kv_indptr, kv_indices, last, layout = make_decode_case(rng, [33, 7], 16, 2, 4, 32)
    sinks = rng.standard_normal(q.shape[1]).astype(np.float32)
    options = (1.0 / np.sqrt(32), None, -1, sinks, 1.0, 1.0)
    launch = prepare_decode(q, cache, kv_indptr, kv_indices, last, layout, *options)
    again = prepare_decode(q, cache, kv_indptr, kv_indices, last, layout, *options)
    assert again is launch
    for a in launch.arrays:
        if isinstance(a, np.ndarray):
            assert not a.flags.writeable and not np.shares_memory(a, sinks)
    sinks[0] += 1.0                                       # a new plan, the kept one unchanged
    assert prepare_decode(q, cache, kv_indptr, kv_indices, last, layout, *options) is not launch


def test_unplannable_arguments_are_not_cached(rng):
    args = make_prefill_case(rng, [3], [20], 16, 1, 2, 32)
    key = plan_cache.plan_key(batch_prefill, ("x", np.arange(3)), ())
    assert key != plan_cache.plan_key(batch_prefill, ("x", np.arange(4)), ())
    with pytest.raises(plan_cache._Uncacheable):
        plan_cache.plan_key(batch_prefill, (object(),), ())
    check(args)
    assert plan_cache.stats()["kept"] >= 1


def test_every_planning_setting_keys_the_plan(monkeypatch):
    """Each NKI_KERNELS_* setting ``buckets`` reads is one ``plan_key`` digests: a plan made
    under one value is not handed to a call under another."""
    from nki_kernels import buckets
    names = {v for k, v in vars(buckets).items()
             if k.endswith("ENV") and isinstance(v, str) and v.startswith("NKI_KERNELS_")}
    assert names == set(buckets.PLANNING_SETTINGS)
    args = ((np.zeros(3),), ())
    for name in buckets.PLANNING_SETTINGS:
        monkeypatch.delenv(name, raising=False)
        before = plan_cache.plan_key(check, *args)
        monkeypatch.setenv(name, "x")
        assert plan_cache.plan_key(check, *args) != before, name
        monkeypatch.delenv(name)
