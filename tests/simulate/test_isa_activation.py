"""ScalarE activation (scale, bias, accumulation registers), activation_reduce, v4 exponential."""

import math

import ml_dtypes
import numpy as np
import pytest

from nki_kernels import simulate
from nki_kernels.simulate import nisa, nl

from .isa_util import events, randn, run, sb

ERF = np.vectorize(math.erf)
FUNCS = [(nl.exp, np.exp), (nl.tanh, np.tanh), (nl.sigmoid, lambda x: 1 / (1 + np.exp(-x))),
         (nl.relu, lambda x: np.maximum(x, 0)), (nl.square, np.square), (nl.copy, lambda x: x),
         (nl.silu, lambda x: x / (1 + np.exp(-x))), (nl.gelu, lambda x: 0.5 * x * (1 + ERF(x / 2 ** .5))),
         (nl.softplus, lambda x: np.log1p(np.exp(x))), (nl.abs, np.abs), (nl.sign, np.sign),
         (nl.erf, ERF), (nl.arctan, np.arctan), (nl.sin, np.sin)]


@pytest.mark.parametrize("op, ref", FUNCS, ids=[o.name for o, _ in FUNCS])
def test_activation_functions(rng, op, ref):
    a = randn(rng, 13, 29)

    def body(x):
        t = sb(x.shape)
        nisa.activation(dst=t, op=op, data=x)
        return t
    np.testing.assert_allclose(run(body, a), ref(a.astype(np.float64)), rtol=2e-5, atol=1e-6)
    (e,) = events("activation")
    assert (e.engine, e.partitions, e.free_elems) == ("scalar", 13, 29)


def test_positive_domain_functions(rng):
    a = np.abs(randn(rng, 3, 50)) + 0.1

    def body(x):
        outs = []
        for op in (nl.log, nl.sqrt, nl.rsqrt, nl.reciprocal):
            t = sb(x.shape)
            nisa.activation(dst=t, op=op, data=x)
            outs.append(t)
        return tuple(outs)
    got = run(body, a)
    for g, want in zip(got, (np.log(a), np.sqrt(a), a ** -0.5, 1 / a)):
        np.testing.assert_allclose(g, want, rtol=1e-5)


def test_scale_and_bias_tiles_and_numbers(rng, target):
    a, s, b = randn(rng, 21, 2, 6), randn(rng, 21, 1), randn(rng, 21, 1)

    def body(x, sc, bi):
        t, u = sb(x.shape, nl.bfloat16), sb(x.shape)
        nisa.activation(dst=t, op=nl.tanh, data=x, scale=sc, bias=bi)
        nisa.activation(dst=u, op=nl.copy, data=x, scale=-2.0, bias=bi)
        return t, u
    t, u = run(body, a, s, b, target=target)
    want = np.tanh(a * s[:, :, None] + b[:, :, None]).astype(ml_dtypes.bfloat16)
    np.testing.assert_allclose(t.astype(np.float32), want.astype(np.float32), rtol=1e-2, atol=1e-2)
    np.testing.assert_allclose(u, -2 * a + b[:, :, None], rtol=1e-6)


def test_scalar_bias_needs_v3():
    def body(x):
        t = sb(x.shape)
        nisa.activation(dst=t, op=nl.exp, data=x, bias=1.0)
        return t
    np.testing.assert_allclose(run(body, np.zeros((2, 2), np.float32)), np.full((2, 2), np.e),
                               rtol=1e-6)
    with pytest.raises(simulate.ValidationError, match="a scalar bias needs NeuronCore-v3"):
        run(body, np.zeros((2, 2), np.float32), target="trn1")


def test_activation_rules(rng):
    a = randn(rng, 4, 6)
    cases = [(dict(op=nl.add), "op=nl.add is not an activation function"),
             (dict(op=nl.exp, reduce_op=nl.maximum), "reduces with nl.add only"),
             (dict(op=nl.exp, bias="tile"), r"bias \(4, 6\) must be a \[4, 1\] tile"),
             (dict(op=nl.exp, reduce_cmd=nisa.reduce_cmd.load_reduce), "load_reduce is not")]
    for kw, match in cases:
        def body(x):
            args = {k: (x if v == "tile" else v) for k, v in kw.items()}
            nisa.activation(dst=sb(x.shape), data=x, **args)
            return x
        with pytest.raises(simulate.ValidationError, match=match):
            run(body, a)


def test_reduce_registers(rng):
    """reset_reduce sums this instruction's rows; reduce adds on top; idle with reduce_op and
    reduce_res acts as activation_reduce; idle without reduce_op reads the registers out."""
    a, b = randn(rng, 9, 12), randn(rng, 9, 5)

    def body(x, y):
        e, f = sb(x.shape), sb(y.shape)
        s1, s2, s3, s4 = (sb((9, 1)) for _ in range(4))
        nisa.activation(dst=e, op=nl.exp, data=x, reduce_op=nl.add, reduce_res=s1,
                        reduce_cmd=nisa.reduce_cmd.reset_reduce)
        nisa.activation(dst=f, op=nl.square, data=y, reduce_op=nl.add, reduce_res=s2,
                        reduce_cmd=nisa.reduce_cmd.reduce)
        nisa.activation(dst=f, op=nl.copy, data=y)                        # idle: no change
        nisa.activation(dst=f, op=nl.copy, data=y, reduce_res=s3)         # read-out only
        nisa.activation_reduce(dst=e, op=nl.copy, data=x, reduce_op=nl.add, reduce_res=s4)
        return s1, s2, s3, s4
    s1, s2, s3, s4 = run(body, a, b)
    e = np.exp(a).sum(1, keepdims=True)
    np.testing.assert_allclose(s1, e, rtol=1e-5)
    np.testing.assert_allclose(s2, e + (b * b).sum(1, keepdims=True), rtol=1e-5)
    np.testing.assert_array_equal(s3, s2)
    np.testing.assert_allclose(s4, a.sum(1, keepdims=True), rtol=1e-4, atol=1e-5)
    assert [ev.details["reduce"] for ev in events("activation")] == [True, True, False, True, True]


def test_registers_start_unwritten():
    def body(x):
        s = sb((2, 1))
        nisa.activation(dst=sb(x.shape), op=nl.exp, data=x, reduce_op=nl.add, reduce_res=s,
                        reduce_cmd=nisa.reduce_cmd.reduce)
        return s
    assert np.isnan(run(body, np.zeros((2, 3), np.float32))).all()


def test_exponential_v4(rng):
    a, m = randn(rng, 6, 10), randn(rng, 6, 1)

    def body(x, mx):
        e, s, s2 = sb(x.shape), sb((6, 1)), sb((6, 1))
        nisa.exponential(dst=e, src=x, max_value=mx, reduce_res=s,
                         reduce_cmd=nisa.reduce_cmd.reset_reduce)
        nisa.exponential(dst=e, src=x, max_value=1.0, reduce_res=s2,
                         reduce_cmd=nisa.reduce_cmd.load_reduce, reduce_init=mx)
        return e, s, s2
    e, s, s2 = run(body, a, m, target="trn3")
    np.testing.assert_allclose(e, np.exp(a - 1.0), rtol=1e-5)
    np.testing.assert_allclose(s, np.exp(a - m).sum(1, keepdims=True), rtol=1e-5)
    np.testing.assert_allclose(s2, m + np.exp(a - 1.0).sum(1, keepdims=True), rtol=1e-5)
    with pytest.raises(simulate.TargetError, match="exponential is a NeuronCore-v4"):
        run(body, a, m, target="trn2")

    def bad_init(x, mx):
        nisa.exponential(dst=sb(x.shape), src=x, reduce_init=1.0)
        return x
    with pytest.raises(simulate.ValidationError, match="reduce_init must be 0.0 unless"):
        run(bad_init, a, m, target="trn3")
