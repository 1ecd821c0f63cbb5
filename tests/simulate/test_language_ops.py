"""nl convenience ops: each allocates its result and lowers to traced nisa instructions."""

import ml_dtypes
import numpy as np
import pytest

from nki_kernels import simulate
from nki_kernels.simulate import jit, nl

from .isa_util import events, randn


def call(fn, *arrays, target=None):
    """Run ``fn(*loaded tiles)`` in a kernel (nl.load / nl.store) and return its result(s)."""
    @jit
    def kernel(*hbm):
        res = fn(*[nl.load(a) for a in hbm])
        outs = []
        for r in (res if isinstance(res, tuple) else (res,)):
            out = nl.ndarray(r.shape, r.dtype, buffer=nl.shared_hbm, name="out")
            nl.store(out, r)
            outs.append(out)
        return tuple(outs) if isinstance(res, tuple) else outs[0]
    return simulate.simulate(kernel, target=target)(*arrays)


def test_load_store_copy_and_trace(rng):
    a = randn(rng, 7, 5)
    np.testing.assert_array_equal(call(lambda x: nl.copy(x), a), a)
    assert [e.op for e in simulate.last_trace()] == ["dma_copy", "tensor_copy", "dma_copy"]
    out = call(lambda x: nl.copy(x, dtype=nl.bfloat16), a)
    np.testing.assert_array_equal(out, a.astype(ml_dtypes.bfloat16))

    @jit
    def cast_load(x):
        out = nl.ndarray(x.shape, nl.float16, buffer=nl.shared_hbm)
        nl.store(out, nl.load(x, dtype=nl.float16))
        return out
    np.testing.assert_array_equal(cast_load(a), a.astype(np.float16))


def test_transpose_and_matmul(rng, target):
    x, y = randn(rng, 40, 96), randn(rng, 96, 130)
    np.testing.assert_array_equal(call(nl.transpose, x, target=target), x.T)
    np.testing.assert_allclose(call(nl.matmul, x, y, target=target), x @ y, rtol=1e-4, atol=1e-4)
    assert [e.op for e in events("nc_matmul")] == ["nc_matmul"]
    assert len(events("nc_transpose")) == 1          # inserted for transpose_x=False
    xT = randn(rng, 96, 40)
    out = call(lambda a, b: nl.matmul(a, b, transpose_x=True), xT, y, target=target)
    np.testing.assert_allclose(out, xT.T @ y, rtol=1e-4, atol=1e-4)
    assert not events("nc_transpose")
    np.testing.assert_array_equal(call(nl.load_transpose2d, x), x.T)


def test_binary_ops_tiles_numbers_and_broadcast(rng):
    a, b, col = randn(rng, 9, 4, 6), randn(rng, 9, 4, 6), randn(rng, 9, 1, 1)
    row = randn(rng, 9, 1, 6)
    np.testing.assert_allclose(call(nl.add, a, b), a + b, rtol=1e-6)
    np.testing.assert_allclose(call(lambda x: nl.subtract(x, 2.5), a), a - 2.5, rtol=1e-6)
    np.testing.assert_allclose(call(lambda x: nl.subtract(2.5, x), a), 2.5 - a, rtol=1e-6)
    np.testing.assert_allclose(call(nl.divide, col, a), col / a, rtol=1e-6)       # [P,1] column
    assert events("tensor_scalar")[0].details["op"] == ("divide",)
    np.testing.assert_allclose(call(nl.multiply, a, row), a * row, rtol=1e-6)     # free bcast
    np.testing.assert_allclose(call(nl.maximum, a, b), np.maximum(a, b))
    with pytest.raises(ValueError, match="partition sizes differ"):
        call(nl.add, a, randn(rng, 1, 4, 6))


def test_dtypes_of_results(rng):
    a = randn(rng, 3, 5)
    i = np.arange(15, dtype=np.int32).reshape(3, 5)
    h = a.astype(ml_dtypes.bfloat16)
    gt = call(nl.greater, a, a * 0)
    assert gt.dtype == np.bool_ and (gt == (a > 0)).all()
    assert call(nl.multiply, i, a).dtype == np.float32
    assert call(lambda x: nl.multiply(x, 0.5), i).dtype == np.float32
    assert call(lambda x: nl.add(x, 1), i).dtype == np.int32
    assert call(nl.add, h, a.astype(np.float16)).dtype == np.float32
    assert call(lambda x: nl.exp(x, dtype=nl.bfloat16), a).dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(call(nl.logical_not, gt.astype(np.uint8)), ~(a > 0))
    np.testing.assert_array_equal(call(nl.invert, i), ~i)


@pytest.mark.parametrize("name, ref", [("exp", np.exp), ("tanh", np.tanh), ("abs", np.abs),
                                       ("square", np.square), ("negative", np.negative),
                                       ("relu", lambda v: np.maximum(v, 0))])
def test_unary_ops(rng, name, ref):
    a = randn(rng, 11, 13)
    np.testing.assert_allclose(call(getattr(nl, name), a), ref(a), rtol=1e-5, atol=1e-7)
    assert events("activation")


@pytest.mark.parametrize("axis, keepdims", [(2, False), ((1, 2), False), (-1, True), (2, True)])
def test_reductions(rng, axis, keepdims):
    a = randn(rng, 6, 3, 7)
    axes = tuple(np.atleast_1d(axis) % 3)
    for fn, ref in ((nl.sum, np.sum), (nl.max, np.max), (nl.min, np.min), (nl.mean, np.mean),
                    (nl.prod, np.prod), (nl.var, np.var)):
        got = call(lambda x: fn(x, axis, keepdims=keepdims), a)
        want = ref(a.astype(np.float64), axis=axes, keepdims=keepdims)
        np.testing.assert_allclose(got.reshape(want.shape), want, rtol=1e-4, atol=1e-5)
        if keepdims:
            assert got.shape == want.shape
    got = call(lambda x: nl.all(x, 2), (a > -1).astype(np.float32))
    np.testing.assert_array_equal(got, (a > -1).all(2))


def test_softmax(rng, target):
    a = randn(rng, 50, 77) * 3
    e = np.exp(a - a.max(1, keepdims=True))
    np.testing.assert_allclose(call(nl.softmax, a, target=target), e / e.sum(1, keepdims=True),
                               rtol=1e-5, atol=1e-7)
    with pytest.raises(ValueError, match="2-D tile and axis=-1"):
        call(lambda x: nl.softmax(x, axis=0), a)


def test_where_broadcast_to_expand_dims(rng):
    a, b = randn(rng, 8, 10), randn(rng, 8, 10)
    cond = (a > 0).astype(np.float32)
    np.testing.assert_array_equal(call(nl.where, cond, a, b), np.where(a > 0, a, b))
    np.testing.assert_array_equal(call(lambda c, x: nl.where(c, x, -1.0), cond, a),
                                  np.where(a > 0, a, np.float32(-1)))
    row = randn(rng, 1, 700)
    np.testing.assert_array_equal(call(lambda r: nl.broadcast_to(r, (100, 700)), row),
                                  np.broadcast_to(row, (100, 700)))
    col = randn(rng, 8, 1)
    np.testing.assert_array_equal(call(lambda c: nl.broadcast_to(c, (8, 5)), col),
                                  np.broadcast_to(col, (8, 5)))
    with pytest.raises(ValueError, match="partitions are replicated only"):
        call(lambda r: nl.broadcast_to(r, (4, 5)), np.zeros((1, 5), np.int32))
    got = call(lambda x: nl.add(nl.expand_dims(nl.sum(x, 1), 2), nl.expand_dims(x, 1)), a)
    np.testing.assert_allclose(got, a.sum(1)[:, None, None] + a[:, None, :], rtol=1e-5)


def test_operator_tokens_still_work_as_isa_ops():
    """nl.exp is both nl.exp(x) and op=nl.exp; outside a convenience call it is a token."""
    assert nl.exp.kind == "activation" and callable(nl.exp)
    assert repr(nl.add) == "nl.add"
