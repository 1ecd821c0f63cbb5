"""The shape-bucket policy the host wrappers pad to."""

import pytest

from nki_kernels import buckets
from nki_kernels.buckets import BucketPolicy


def test_default_ladder_is_powers_of_two():
    p = BucketPolicy()
    assert [p.bucket(n) for n in (0, 1, 2, 3, 5, 8, 9, 33, 1000)] == [1, 1, 2, 4, 8, 8, 16, 64, 1024]


def test_minimum_growth_and_exact():
    assert [BucketPolicy(8, 2).bucket(n) for n in (1, 8, 9, 17)] == [8, 8, 16, 32]
    assert [BucketPolicy(4, 1.5).bucket(n) for n in (5, 7, 10)] == [6, 9, 13]
    assert [BucketPolicy(exact=True).bucket(n) for n in (0, 3, 17)] == [1, 3, 17]


@pytest.mark.parametrize("kwargs, rule", [(dict(minimum=0), "minimum"), (dict(growth=1.0), "growth")])
def test_bad_policy_names_the_rule(kwargs, rule):
    with pytest.raises(ValueError, match=rule):
        BucketPolicy(**kwargs)


def test_environment_and_setter(monkeypatch):
    monkeypatch.setenv(buckets.ENV, "8,2")
    assert buckets._from_env() == BucketPolicy(8, 2.0)
    monkeypatch.setenv(buckets.ENV, "exact")
    assert buckets._from_env().exact
    monkeypatch.setenv(buckets.ENV, "eight")
    with pytest.raises(ValueError, match=buckets.ENV):
        buckets._from_env()
    previous = buckets.set_bucket_policy(BucketPolicy(16))
    try:
        assert buckets.bucket(3) == 16
    finally:
        buckets.set_bucket_policy(previous)
    with pytest.raises(TypeError):
        buckets.set_bucket_policy("16")


@pytest.mark.parametrize("policy, floors", [
    (BucketPolicy(), {1: 1, 2: 2, 4: 3, 8: 5, 16: 9, 32: 17}),
    (BucketPolicy(8, 2), {8: 1, 16: 9, 32: 17}),
    (BucketPolicy(4, 1.5), {4: 1, 6: 5, 9: 7, 13: 10}),
    (BucketPolicy(exact=True), {1: 1, 5: 5, 16: 16}),
])
def test_bucket_floor_is_the_least_size_padded_to_the_bucket(policy, floors):
    old = buckets.set_bucket_policy(policy)
    try:
        for b, least in floors.items():
            assert buckets.bucket_floor(b) == least
            assert policy.bucket(least) == b
            assert least == 1 or policy.bucket(least - 1) < b
    finally:
        buckets.set_bucket_policy(old)
