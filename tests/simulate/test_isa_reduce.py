"""Reductions against NumPy: tensor_reduce, tensor_scalar_reduce, tensor_partition_reduce,
bn_stats/bn_aggr, max8."""

import numpy as np
import pytest

from nki_kernels import simulate
from nki_kernels.simulate import nisa, nl

from .isa_util import events, randn, run, sb

REDUCE = [(nl.add, np.sum), (nl.maximum, np.max), (nl.minimum, np.min), (nl.multiply, np.prod)]


@pytest.mark.parametrize("op, ref", REDUCE, ids=[o.name for o, _ in REDUCE])
@pytest.mark.parametrize("axis", [3, (2, 3), (1, 2, 3), -1])
def test_tensor_reduce(rng, op, ref, axis):
    a = randn(rng, 11, 3, 4, 5) * 0.9
    axes = tuple(np.atleast_1d(axis) % 4)
    want = ref(a.astype(np.float64), axis=axes)
    kept = want.shape[1:] if len(want.shape) > 1 else (1,)

    def body(x):
        t = sb((11,) + kept)
        nisa.tensor_reduce(dst=t, op=op, data=x, axis=axis)
        return t
    np.testing.assert_allclose(run(body, a).reshape(want.shape), want, rtol=1e-5, atol=1e-5)
    (e,) = events("tensor_reduce")
    assert (e.engine, e.partitions, e.free_elems) == ("vector", 11, 60)


def test_tensor_reduce_negate_keepdims_and_bitvec(rng):
    a = randn(rng, 7, 9)
    ints = rng.integers(-2 ** 31, 2 ** 31 - 1, (7, 9), dtype=np.int64).astype(np.int32)

    def body(x, i):
        neg, bits = sb((7, 1)), sb((7, 1), nl.int32)
        nisa.tensor_reduce(dst=neg, op=nl.maximum, data=x, axis=1, negate=True, keepdims=True)
        nisa.tensor_reduce(dst=bits, op=nl.bitwise_xor, data=i, axis=1)
        return neg, bits
    neg, bits = run(body, a, ints)
    np.testing.assert_array_equal(neg, -a.max(1, keepdims=True))
    np.testing.assert_array_equal(bits[:, 0], np.bitwise_xor.reduce(ints, axis=1))


@pytest.mark.parametrize("kw, dst_shape, match", [
    (dict(op=nl.add, axis=1), (3, 5), "must be the last contiguous free axes"),
    (dict(op=nl.add, axis=(0, 1, 2)), (3, 1), "partition axis 0 is never reduced"),
    (dict(op=nl.add, axis=2), (3, 5), "dst holds 5 elements per partition"),
    (dict(op=nl.divide, axis=2), (3, 4), "nl.divide is not a legal reduction operator"),
    (dict(op=nl.bitwise_or, axis=2), (3, 4), "needs integer tensors"),
])
def test_tensor_reduce_rules(kw, dst_shape, match):
    def body(x):
        nisa.tensor_reduce(dst=sb(dst_shape), data=x, **kw)
        return x
    with pytest.raises(simulate.ValidationError, match=match):
        run(body, np.zeros((3, 4, 5), np.float32))


def test_tensor_scalar_reduce(rng):
    a, c = randn(rng, 10, 2, 7), randn(rng, 10, 1)

    def body(x, col):
        t, r1, r2, r3 = sb(x.shape), sb((10, 1)), sb((10, 1)), sb((10, 1))
        nisa.tensor_scalar_reduce(dst=t, data=x, op0=nl.multiply, operand0=col,
                                  reduce_op=nl.maximum, reduce_res=r1)
        nisa.tensor_scalar_reduce(dst=t, data=x, op0=nl.add, operand0=1.0, reduce_op=nl.add,
                                  reduce_res=r2, reduce_cmd=nisa.reduce_cmd.load_reduce,
                                  reduce_init=col, reduce_res_negate=True)
        nisa.tensor_scalar_reduce(dst=t, data=x, op0=nl.greater_equal, operand0=0.0,
                                  reduce_op=nl.add, reduce_res=r3)
        return t, r1, r2, r3
    t, r1, r2, r3 = run(body, a, c)
    flat = a.reshape(10, -1)
    np.testing.assert_allclose(r1[:, 0], (flat * c).max(1), rtol=1e-6)
    np.testing.assert_allclose(r2, -(c + (flat + 1).sum(1, keepdims=True)), rtol=1e-5)
    np.testing.assert_array_equal(r3[:, 0], (flat >= 0).sum(1))
    np.testing.assert_array_equal(t, (a >= 0).astype(np.float32))
    with pytest.raises(simulate.ValidationError, match="reduce_init is given exactly when"):
        run(lambda x, col: (nisa.tensor_scalar_reduce(
            dst=sb(x.shape), data=x, op0=nl.add, operand0=1.0, reduce_op=nl.add,
            reduce_res=sb((10, 1)), reduce_init=col), x)[1], a, c)
    with pytest.raises(simulate.ValidationError, match="reduce_op=nl.subtract must be one of"):
        run(lambda x, col: (nisa.tensor_scalar_reduce(
            dst=sb(x.shape), data=x, op0=nl.add, operand0=1.0, reduce_op=nl.subtract,
            reduce_res=sb((10, 1))), x)[1], a, c)


def test_tensor_partition_reduce(rng):
    a = randn(rng, 37, 6)
    ints = rng.integers(0, 1000, (37, 6)).astype(np.int32)

    def body(x, i):
        s, m, o = sb((1, 6)), sb((1, 6)), sb((1, 6), nl.int32)
        nisa.tensor_partition_reduce(dst=s, op=nl.add, data=x)
        nisa.tensor_partition_reduce(dst=m, op=nl.maximum, data=x)
        nisa.tensor_partition_reduce(dst=o, op=nl.bitwise_or, data=i)
        return s, m, o
    s, m, o = run(body, a, ints)
    np.testing.assert_allclose(s, a.sum(0, keepdims=True), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(m, a.max(0, keepdims=True))
    np.testing.assert_array_equal(o, np.bitwise_or.reduce(ints, axis=0, keepdims=True))
    assert events("tensor_partition_reduce")[0].engine == "gpsimd"
    with pytest.raises(simulate.ValidationError, match="op=nl.minimum must be one of"):
        run(lambda x, i: (nisa.tensor_partition_reduce(dst=sb((1, 6)), op=nl.minimum, data=x),
                          x)[1], a, ints)


@pytest.mark.parametrize("F", [1, 7, 512])
def test_bn_stats_and_aggr(rng, F):
    a = randn(rng, 13, F) * 3 + 1

    def body(x):
        st, mv = sb((13, 6)), sb((13, 2))
        nisa.bn_stats(dst=st, data=x)
        nisa.bn_aggr(dst=mv, data=st)
        return st, mv
    st, mv = run(body, a)
    even, odd = a[:, 0::2], a[:, 1::2]
    np.testing.assert_allclose(st[:, 0], even.shape[1])
    np.testing.assert_allclose(st[:, 1], even.mean(1), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(st[:, 2], even.var(1) * even.shape[1], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(st[:, 3], odd.shape[1])
    np.testing.assert_allclose(mv[:, 0], a.mean(1), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(mv[:, 1], a.var(1), rtol=1e-4, atol=1e-5)


def test_bn_over_chunks_and_limits(rng):
    """mean/var of 1000 columns: bn_stats per <= 512-column chunk into one tile, one bn_aggr."""
    a = randn(rng, 4, 1000)

    def body(x):
        st, mv = sb((4, 12)), sb((4, 2))
        nisa.bn_stats(dst=st[:, 0:6], data=x[:, 0:512])
        nisa.bn_stats(dst=st[:, 6:12], data=x[:, 512:1000])
        nisa.bn_aggr(dst=mv, data=st)
        return mv
    mv = run(body, a)
    np.testing.assert_allclose(mv, np.stack([a.mean(1), a.var(1)], 1), rtol=1e-4, atol=1e-5)
    with pytest.raises(simulate.ValidationError, match="bn_stats takes at most 512"):
        run(lambda x: (nisa.bn_stats(dst=sb((4, 6)), data=x), x)[1], a)
    with pytest.raises(simulate.ValidationError, match="not a multiple of 3"):
        run(lambda x: (nisa.bn_aggr(dst=sb((4, 2)), data=x[:, 0:7]), x)[1], a)


def test_max8(rng):
    a = randn(rng, 9, 3, 11)

    def body(x):
        t = sb((9, 8))
        nisa.max8(dst=t, src=x)
        return t
    np.testing.assert_array_equal(run(body, a), -np.sort(-a.reshape(9, -1), axis=1)[:, :8])
    with pytest.raises(simulate.ValidationError, match="max8 reads 8 to 16384"):
        run(body, a[:, :1, :7].copy())
