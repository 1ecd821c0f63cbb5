"""Every @post of the algebra, checked against NumPy index arithmetic on np.arange."""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from nki_kernels.access_patterns import AccessPattern, compose, permute, reinterpret, split, tile

shapes = st.lists(st.integers(1, 6), min_size=1, max_size=4)


def strided(shape):
    """The AP of a C-contiguous array of ``shape`` and the matching NumPy index array."""
    strides = np.cumprod((list(shape[1:]) + [1])[::-1])[::-1]
    return AccessPattern.from_strides(shape, strides.tolist()), np.arange(int(np.prod(shape))).reshape(shape)


@settings(max_examples=100, deadline=None)
@given(shapes, st.data())
def test_split(shape, data):
    ap, arr = strided(shape)
    d = data.draw(st.integers(0, len(shape) - 1))
    k = data.draw(st.sampled_from([f for f in range(1, shape[d] + 1) if shape[d] % f == 0]))
    out = split(ap, d, k)
    np.testing.assert_array_equal(out.indices(), arr.reshape(shape[:d] + [shape[d] // k, k] + shape[d + 1:]))


@settings(max_examples=100, deadline=None)
@given(shapes, st.data())
def test_tile(shape, data):
    ap, arr = strided(shape)
    d = data.draw(st.integers(0, len(shape) - 1))
    size = data.draw(st.integers(1, 7))
    tiles = tile(ap, d, size)
    assert all(t.shape[d] <= size for t in tiles)
    np.testing.assert_array_equal(np.concatenate([t.indices() for t in tiles], axis=d), arr)


@settings(max_examples=150, deadline=None)
@given(shapes, st.data())
def test_compose_with_slice(shape, data):
    ap, arr = strided(shape)
    key = []
    for n in shape:
        if data.draw(st.booleans()) and len(key) < len(shape) - 1:
            key.append(data.draw(st.integers(-n, n - 1)))
        else:
            a = data.draw(st.integers(0, n - 1))
            b = data.draw(st.integers(a + 1, n))
            key.append(slice(a, b, data.draw(st.integers(1, 3))))
    np.testing.assert_array_equal(compose(ap, tuple(key)).indices(), arr[tuple(key)])


@settings(max_examples=100, deadline=None)
@given(shapes, st.randoms())
def test_permute(shape, rnd):
    ap, arr = strided(shape)
    dims = list(range(len(shape)))
    rnd.shuffle(dims)
    np.testing.assert_array_equal(permute(ap, dims).indices(), arr.transpose(dims))


@pytest.mark.parametrize("src, dst", [(np.int32, np.float16), (np.float16, np.int32), (np.int8, np.int32)])
def test_reinterpret_covers_the_same_bytes(src, dst):
    # rows 1..2 of a (4, 8) int32-sized byte region, as another element size
    ap = AccessPattern([[8, 2], [1, 8]], 8)
    if np.dtype(src).itemsize < np.dtype(dst).itemsize:
        ap = AccessPattern([[32, 2], [1, 32]], 32)
    out = reinterpret(ap, src, dst)
    s, d = np.dtype(src).itemsize, np.dtype(dst).itemsize
    before = {i * s + b for i in ap.indices().ravel() for b in range(s)}
    after = {i * d + b for i in out.indices().ravel() for b in range(d)}
    assert before == after and out.dtype == np.dtype(dst)


def test_algebra_refusals():
    ap = AccessPattern([[3, 6], [1, 3]])
    with pytest.raises(ValueError, match="cannot split dimension 0 of size 6 into pieces of 4"):
        split(ap, 0, 4)
    with pytest.raises(ValueError, match="not a permutation"):
        permute(ap, [0, 0])
    with pytest.raises(ValueError, match="is empty"):
        compose(ap, (slice(2, 2),))
    with pytest.raises(ValueError, match="not a whole number"):
        reinterpret(AccessPattern([[1, 3]]), np.int16, np.int32)
    with pytest.raises(ValueError, match="unit-step"):
        reinterpret(AccessPattern([[2, 4]]), np.int32, np.int16)
