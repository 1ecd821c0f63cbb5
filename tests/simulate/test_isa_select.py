"""Selections against NumPy: affine_select (with iota), range_select, select_reduce."""

import ml_dtypes
import numpy as np
import pytest

from nki_kernels import simulate
from nki_kernels.simulate import nisa, nl

from .isa_util import events, ps, randn, run, sb

FP32_MIN = np.float32(-3.4028235e38)


@pytest.mark.parametrize("q0, k0", [(0, 0), (5, 0), (0, 3)])
def test_affine_select_causal_mask(rng, q0, k0):
    """Causal mask of a [Q, K] score tile at query offset q0, key offset k0: keep key j <= query i,
    i.e. (q0 + i) - (k0 + j) >= 0."""
    a = randn(rng, 9, 13)

    def body(x):
        t = sb(x.shape)
        nisa.affine_select(dst=t, pattern=[[-1, 13]], channel_multiplier=1, on_true_tile=x,
                           on_false_value=FP32_MIN, cmp_op=nl.greater_equal, offset=q0 - k0)
        return t
    i, j = np.arange(9)[:, None] + q0, np.arange(13)[None, :] + k0
    np.testing.assert_array_equal(run(body, a), np.where(j <= i, a, FP32_MIN))
    assert events("affine_select")[0].engine == "gpsimd"


def test_affine_select_multi_dim_pattern_and_dtype_cast(rng):
    a = randn(rng, 4, 3, 5)

    def body(x):
        t = sb(x.shape, nl.bfloat16)
        # value = 2*p + 5*u + v - 7 ; default cmp_op equal (keep where value == 0)
        nisa.affine_select(dst=t, pattern=[[5, 3], [1, 5]], channel_multiplier=2, on_true_tile=x,
                           on_false_value=-1.0, offset=-7)
        return t
    p, u, v = np.meshgrid(np.arange(4), np.arange(3), np.arange(5), indexing="ij")
    want = np.where(2 * p + 5 * u + v - 7 == 0, a, -1.0).astype(ml_dtypes.bfloat16)
    np.testing.assert_array_equal(run(body, a), want)


def test_affine_select_rules(rng):
    a = randn(rng, 4, 6)

    def in_psum(x):
        p = ps(x.shape)
        nisa.tensor_copy(dst=p, src=x)
        nisa.affine_select(dst=sb(x.shape), pattern=[[1, 6]], channel_multiplier=0,
                           on_true_tile=p, on_false_value=0.0)
        return x
    with pytest.raises(simulate.ValidationError, match=r"affine_select\(on_true_tile\).*accepts sbuf"):
        run(in_psum, a)
    with pytest.raises(simulate.ValidationError, match="makes 5 elements per partition, dst has 6"):
        run(lambda x: (nisa.affine_select(dst=sb(x.shape), pattern=[[1, 5]], channel_multiplier=0,
                                          on_true_tile=x, on_false_value=0.0), x)[1], a)
    with pytest.raises(simulate.ValidationError, match="cmp_op=nl.add is not an ALU operator"):
        run(lambda x: (nisa.affine_select(dst=sb(x.shape), pattern=[[1, 6]], channel_multiplier=0,
                                          on_true_tile=x, on_false_value=0.0, cmp_op=nl.add),
                       x)[1], a)


def test_iota_feeds_a_predicate():
    """iota -> tensor_scalar (less) -> tensor_copy_predicated: keep flat index < 10."""
    def body(x):
        idx = sb((4, 6), nl.int32)
        nisa.iota(dst=idx, pattern=[[1, 6]], offset=0, channel_multiplier=6)
        pred = sb((4, 6), nl.uint8)
        nisa.tensor_scalar(dst=pred, data=idx, op0=nl.less, operand0=10)
        t = sb((4, 6))
        nisa.memset(dst=t, value=-1.0)
        nisa.tensor_copy_predicated(dst=t, src=x, predicate=pred)
        return t
    x = np.arange(24, dtype=np.float32).reshape(4, 6) + 100
    np.testing.assert_array_equal(run(body, x), np.where(np.arange(24).reshape(4, 6) < 10, x, -1))


def test_range_select(rng):
    a, lo = randn(rng, 5, 12), np.array([[0], [2], [4], [11], [12]], np.float32)

    def body(x, b0):
        t, m = sb(x.shape), sb((5, 1))
        nisa.range_select(dst=t, on_true_tile=x, comp_op0=nl.greater_equal, comp_op1=nl.less,
                          bound0=b0, bound1=12.0, reduce_res=m, range_start=3,
                          reduce_op=nl.maximum)
        return t, m
    t, m = run(body, a, lo)
    j = np.arange(12)[None, :] + 3
    keep = (j >= lo) & (j < 12)
    want = np.where(keep, a, FP32_MIN)
    np.testing.assert_array_equal(t, want)
    np.testing.assert_array_equal(m, want.max(1, keepdims=True))
    with pytest.raises(simulate.TargetError, match="range_select needs NeuronCore-v3"):
        run(body, a, lo, target="trn1")


@pytest.mark.parametrize("kw, match", [
    (dict(on_false_value=-1e30), "on_false_value must be FP32_MIN"),
    (dict(comp_op0=nl.not_equal), "comp_op0=nl.not_equal must be one of"),
    (dict(reduce_op=nl.add), "only nl.maximum is supported"),
])
def test_range_select_rules(kw, match):
    def body(x):
        args = dict(comp_op0=nl.greater_equal, comp_op1=nl.less, bound0=0.0, bound1=3.0)
        args.update(kw)
        nisa.range_select(dst=sb(x.shape), on_true_tile=x, **args)
        return x
    with pytest.raises(simulate.ValidationError, match=match):
        run(body, np.zeros((2, 4), np.float32))


def test_select_reduce(rng):
    a, col = randn(rng, 7, 10), randn(rng, 7, 1)
    pred = (rng.random((7, 10)) < 0.4).astype(np.uint8)

    def body(x, p, c):
        t, u, m = sb(x.shape), sb(x.shape), sb((7, 1))
        nisa.select_reduce(dst=t, predicate=p, on_true=x, on_false=c, reduce_res=m)
        nisa.select_reduce(dst=u, predicate=p, on_true=x, on_false=-5.0, reverse_pred=True)
        return t, u, m
    t, u, m = run(body, a, pred, col)
    want = np.where(pred != 0, a, col)
    np.testing.assert_array_equal(t, want)
    np.testing.assert_array_equal(m, want.max(1, keepdims=True))
    np.testing.assert_array_equal(u, np.where(pred == 0, a, np.float32(-5.0)))
    with pytest.raises(simulate.ValidationError, match="predicate must be int8/uint8/int16/uint16"):
        run(body, a, pred.astype(np.uint32), col)
    with pytest.raises(simulate.ValidationError, match="on_true cannot be int32"):
        run(body, a.astype(np.int32), pred, col)


def test_there_is_no_nisa_select():
    """NKI has no nisa.select (nl.where / tensor_copy_predicated / select_reduce instead)."""
    assert not hasattr(nisa, "select")
