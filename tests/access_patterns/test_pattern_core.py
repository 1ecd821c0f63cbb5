"""AccessPattern value semantics and the rules in access_patterns.check, against NumPy and the seed."""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from nki_kernels.access_patterns import (AccessPattern, AccessPatternError, check_bounds, check_not_nested,
                             check_partition_rule, coalesce, contiguous_run, reinterpret_count)


def seed_loop(pattern, offset):
    """The seed document's pseudo-code: nested loops accumulating offset + sum(i * step)."""
    out = []

    def rec(dim, acc):
        if dim == len(pattern):
            out.append(acc)
            return
        step, num = pattern[dim]
        for i in range(num):
            rec(dim + 1, acc + i * step)
    rec(0, offset)
    return np.array(out).reshape([n for _, n in pattern])


patterns = st.lists(st.tuples(st.integers(-6, 40), st.integers(1, 5)), min_size=1, max_size=4)


@settings(max_examples=150, deadline=None)
@given(patterns, st.integers(0, 300))
def test_indices_equal_seed_loop(pattern, offset):
    ap = AccessPattern(pattern, offset)
    np.testing.assert_array_equal(ap.indices(), seed_loop(pattern, offset))
    assert ap.shape == tuple(n for _, n in pattern) and ap.size == ap.indices().size
    lo, hi = ap.extent
    assert lo == ap.indices().min() and hi == ap.indices().max()


@settings(max_examples=150, deadline=None)
@given(patterns, st.integers(0, 300))
def test_coalesce_keeps_order_and_size(pattern, offset):
    ap = AccessPattern(pattern, offset)
    c = coalesce(ap)
    assert c.size == ap.size
    np.testing.assert_array_equal(c.indices().reshape(-1), ap.indices().reshape(-1))
    assert ap.size % contiguous_run(ap) == 0


def test_seed_concrete_example():
    # t[0:16, 8:16] of a (16, 16) tensor: offset 8, rows of 16, 8 columns.
    ap = AccessPattern([[16, 16], [1, 8]], offset=8)
    view = np.arange(256).reshape(16, 16)[0:16, 8:16]
    np.testing.assert_array_equal(ap.indices(), view)
    assert ap(1, 2) == 8 + 16 + 2
    assert str(ap) == "8 + (16:16, 8:1)"


def test_partition_rule():
    check_partition_rule(AccessPattern([[32, 16], [1, 32]]), (16, 32), "sbuf")
    with pytest.raises(AccessPatternError, match="partition step 64 must equal the tensor's free size 32"):
        check_partition_rule(AccessPattern([[64, 8], [1, 32]]), (16, 32), "sbuf")
    with pytest.raises(AccessPatternError, match="partition count 129 exceeds"):
        check_partition_rule(AccessPattern([[4, 129], [1, 4]]), (129, 4), "psum")
    with pytest.raises(AccessPatternError, match="each partition is addressed on its own"):
        check_partition_rule(AccessPattern([[32, 2], [1, 33]]), (16, 32), "sbuf")
    check_partition_rule(AccessPattern([[64, 8], [1, 32]]), (16, 32), "hbm")   # HBM: any pattern


def test_bounds_and_nesting():
    check_bounds(AccessPattern([[16, 16], [1, 16]]), 256)
    with pytest.raises(AccessPatternError, match="reaches flat index 256, tensor has 256 elements"):
        check_bounds(AccessPattern([[16, 16], [1, 16]], 1), 256)
    with pytest.raises(AccessPatternError, match="before the tensor's start"):
        check_bounds(AccessPattern([[-1, 4]], 2), 256)
    with pytest.raises(AccessPatternError, match="already indexed"):
        check_not_nested(True)


def test_reinterpret_count_seed_example():
    # (128, 256) int32 seen as bf16: 256 * 4 bytes / 2 bytes = 512 elements per partition.
    assert reinterpret_count(256, np.int32, "float16") == 512
    assert reinterpret_count(512, np.float16, np.int32) == 256
    with pytest.raises(AccessPatternError, match="not a whole number"):
        reinterpret_count(3, np.float16, np.int32)


def test_bad_patterns_refused():
    with pytest.raises(ValueError, match="num must be >= 1"):
        AccessPattern([[1, 0]])
    with pytest.raises(ValueError, match="must be a \\[step, num\\] pair"):
        AccessPattern([[1, 2, 3]])
    with pytest.raises(ValueError, match="at least one"):
        AccessPattern([])
