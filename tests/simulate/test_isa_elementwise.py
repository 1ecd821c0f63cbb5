"""Element-wise instructions against NumPy: tensor_tensor, tensor_scalar, scalar_tensor_tensor,
reciprocal, tensor_copy_predicated; engine, buffer and dtype rules."""

import ml_dtypes
import numpy as np
import pytest

from nki_kernels import simulate
from nki_kernels.simulate import nisa, nl

from .isa_util import events, ps, randn, run, sb

BINARY = [(nl.add, np.add), (nl.subtract, np.subtract), (nl.multiply, np.multiply),
          (nl.maximum, np.maximum), (nl.minimum, np.minimum), (nl.divide, np.divide),
          (nl.greater, np.greater), (nl.less_equal, np.less_equal), (nl.equal, np.equal),
          (nl.not_equal, np.not_equal), (nl.logical_and, np.logical_and),
          (nl.logical_or, np.logical_or), (nl.logical_xor, np.logical_xor)]


def tt(op, dtype=nl.float32, **kw):
    def body(x, y):
        t = sb(x.shape, dtype)
        nisa.tensor_tensor(dst=t, data1=x, data2=y, op=op, **kw)
        return t
    return body


@pytest.mark.parametrize("op, ref", BINARY, ids=[o.name for o, _ in BINARY])
def test_tensor_tensor_ops(rng, op, ref):
    a, b = randn(rng, 37, 3, 7), randn(rng, 37, 3, 7)
    b[0, 0, :3] = a[0, 0, :3]                    # some equal elements for the comparisons
    a[1, 1, :2] = 0.0                            # and some zeros for the logical ops
    with np.errstate(divide="ignore"):
        want = ref(a, b).astype(np.float32)
    np.testing.assert_allclose(run(tt(op), a, b), want, rtol=1e-6)
    (e,) = events("tensor_tensor")
    assert (e.engine, e.partitions, e.free_elems) == ("vector", 37, 21)


def test_tensor_tensor_casts_to_dst_dtype(rng):
    a, b = randn(rng, 5, 9).astype(ml_dtypes.bfloat16), randn(rng, 5, 9)
    want = (a.astype(np.float32) * b).astype(ml_dtypes.bfloat16)
    np.testing.assert_array_equal(run(tt(nl.multiply, nl.bfloat16), a, b), want)
    # comparison result 1.0/0.0 into uint8
    np.testing.assert_array_equal(run(tt(nl.greater, nl.uint8), a, b),
                                  (a.astype(np.float32) > b).astype(np.uint8))


def test_int32_goes_to_gpsimd_with_exact_math():
    a = np.array([[2 ** 30 + 1, -7, 2 ** 31 - 2]], np.int32)
    b = np.array([[2, 3, 1]], np.int32)
    np.testing.assert_array_equal(run(tt(nl.add, nl.int32), a, b), a + b)
    assert events("tensor_tensor")[0].engine == "gpsimd"
    # forced onto VectorE: fp32 math, so 2**30 + 3 rounds
    out = run(tt(nl.add, nl.int32, engine=nisa.engine.vector), a, b)
    assert out[0, 0] == np.int32(np.float32(2 ** 30 + 3)) and out[0, 1] == -4


def test_bitvec_ops_keep_bit_patterns():
    a = np.array([[-1, 0x0F0F0F0F, -16, 5]], np.int32)
    b = np.array([[0x0000FFFF, 0x00FF00FF, 2, 31]], np.int32)
    np.testing.assert_array_equal(run(tt(nl.bitwise_and, nl.int32), a, b), a & b)
    np.testing.assert_array_equal(run(tt(nl.bitwise_xor, nl.int32), a, b), a ^ b)
    b[0, :2] = 4, 8                              # shift amounts below 32
    want = (a.view(np.uint32) >> b.astype(np.uint32)).view(np.int32)     # logical shift
    np.testing.assert_array_equal(run(tt(nl.right_shift, nl.int32), a, b), want)
    np.testing.assert_array_equal(run(tt(nl.left_shift, nl.int32), a, b),
                                  (a.view(np.uint32) << b.astype(np.uint32)).view(np.int32))
    with pytest.raises(simulate.ValidationError, match="bitvec operator nl.bitwise_and needs "
                                                       "integer tensors; data2 is float32"):
        run(tt(nl.bitwise_and, nl.int32), a, b.astype(np.float32))


def test_tensor_tensor_rules(rng):
    a = randn(rng, 4, 6)

    def both_psum(x, y):
        p, q = ps(x.shape), ps(x.shape)
        nisa.tensor_copy(dst=p, src=x)
        nisa.tensor_copy(dst=q, src=y)
        nisa.tensor_tensor(dst=sb(x.shape), data1=p, data2=q, op=nl.add)
        return x
    with pytest.raises(simulate.ValidationError, match="data1 and data2 cannot both be in PSUM"):
        run(both_psum, a, a)

    def gpsimd_psum(x, y):
        p = ps(x.shape)
        nisa.tensor_copy(dst=p, src=x)
        nisa.tensor_tensor(dst=sb(x.shape), data1=p, data2=y, op=nl.add, engine=nisa.engine.gpsimd)
        return x
    with pytest.raises(simulate.ValidationError, match="GpSimd cannot access PSUM"):
        run(gpsimd_psum, a, a)
    with pytest.raises(simulate.ValidationError, match=r"elements per partition differ"):
        run(tt(nl.add), a, randn(rng, 4, 5))
    with pytest.raises(simulate.ValidationError, match=r"partition counts differ"):
        run(tt(nl.add), a, randn(rng, 3, 6))
    with pytest.raises(simulate.ValidationError, match="op=nl.exp is not an ALU operator"):
        run(tt(nl.exp), a, a)
    with pytest.raises(simulate.ValidationError, match="engine=scalar is not one of"):
        run(tt(nl.add, engine=nisa.engine.scalar), a, a)
    with pytest.raises(simulate.ValidationError, match="nl.abs_max needs NeuronCore-v4"):
        run(tt(nl.abs_max), a, a)
    np.testing.assert_allclose(run(tt(nl.abs_max), a, -2 * a, target="trn3"), 2 * np.abs(a))


def test_power_runs_on_gpsimd(rng):
    a, b = np.abs(randn(rng, 3, 5)) + 0.5, randn(rng, 3, 5)
    np.testing.assert_allclose(run(tt(nl.power), a, b), a ** b, rtol=1e-5)
    assert events("tensor_tensor")[0].engine == "gpsimd"
    with pytest.raises(simulate.ValidationError, match="nl.power runs on GpSimd only"):
        run(tt(nl.power, engine=nisa.engine.vector), a, b)


def ts(dtype=nl.float32, **kw):
    """tensor_scalar body; an operand given as "col" is the [P, 1] tile passed after data."""
    def body(x, *cols):
        t = sb(x.shape, dtype)
        args = dict(kw)
        for role, k in (("operand0", 0), ("operand1", -1)):
            if args.get(role) == "col":
                args[role] = cols[k]
        nisa.tensor_scalar(dst=t, data=x, **args)
        return t
    return body


def test_tensor_scalar_two_stages_and_reverse(rng):
    a, c = randn(rng, 19, 2, 5), randn(rng, 19, 1)
    out = run(ts(op0=nl.subtract, operand0="col", reverse0=True, op1=nl.multiply, operand1=3.0),
              a, c)
    np.testing.assert_allclose(out, (c[:, :, None] - a) * 3.0, rtol=1e-6)
    out = run(ts(op0=nl.maximum, operand0=0.25, op1=nl.divide, operand1="col", reverse1=True), a, c)
    np.testing.assert_allclose(out, c[:, :, None] / np.maximum(a, 0.25), rtol=1e-6)


def test_tensor_scalar_unary_ops_and_bypass(rng):
    a = randn(rng, 7, 11)
    out = run(ts(op0=nl.abs, operand0=None, op1=nl.add, operand1=1.0), a)
    np.testing.assert_allclose(out, np.abs(a) + 1, rtol=1e-6)
    out = run(ts(op0=nl.multiply, operand0=2.0, op1=nl.bypass), a)
    np.testing.assert_allclose(out, 2 * a, rtol=1e-6)
    with pytest.raises(simulate.ValidationError, match="operand0 must be None or 0 for the unary"):
        run(ts(op0=nl.rsqrt, operand0=2.0), a)


def test_tensor_scalar_int_math_is_fp32_on_vector_exact_on_gpsimd():
    a = np.array([[2 ** 30, 7]], np.int32)
    out = run(ts(nl.int32, op0=nl.add, operand0=1), a)
    np.testing.assert_array_equal(out, [[2 ** 30, 8]])          # 2**30 + 1 rounds in fp32
    out = run(ts(nl.int32, op0=nl.add, operand0=1, engine=nisa.engine.gpsimd), a)
    np.testing.assert_array_equal(out, a + 1)


def test_tensor_scalar_rules(rng):
    a = randn(rng, 4, 6)
    ints = np.arange(24, dtype=np.int32).reshape(4, 6)
    with pytest.raises(simulate.ValidationError, match="ScalarE on trn2 supports op pairs"):
        run(ts(op0=nl.add, operand0=1.0, op1=nl.multiply, operand1=2.0,
               engine=nisa.engine.scalar), a)
    # the same pair is fine on VectorE, and on ScalarE of trn1
    run(ts(op0=nl.add, operand0=1.0, op1=nl.multiply, operand1=2.0, engine=nisa.engine.scalar),
        a, target="trn1")
    np.testing.assert_allclose(
        run(ts(op0=nl.multiply, operand0=2.0, op1=nl.add, operand1=1.0,
               engine=nisa.engine.scalar), a), 2 * a + 1, rtol=1e-6)
    with pytest.raises(simulate.ValidationError, match="both be bitvec or both arithmetic"):
        run(ts(nl.int32, op0=nl.bitwise_and, operand0=3, op1=nl.add, operand1=1), ints)
    with pytest.raises(simulate.ValidationError, match="bitvec operators run on VectorE only"):
        run(ts(nl.int32, op0=nl.bitwise_and, operand0=3, engine=nisa.engine.gpsimd), ints)
    np.testing.assert_array_equal(run(ts(nl.int32, op0=nl.bitwise_and, operand0=3), ints), ints & 3)
    with pytest.raises(simulate.ValidationError, match=r"operand0 tile \(4, 2\) must be \[4, 1\]"):
        run(ts(op0=nl.add, operand0="col"), a, randn(rng, 4, 2))
    with pytest.raises(simulate.ValidationError, match="operand1 given without op1"):
        run(ts(op0=nl.add, operand0=1.0, operand1=2.0), a)


def test_scalar_tensor_tensor(rng):
    a, b, c = randn(rng, 33, 9), randn(rng, 33, 9), randn(rng, 33, 1)

    def body(x, y, col):
        t = sb(x.shape)
        nisa.scalar_tensor_tensor(dst=t, data=x, op0=nl.multiply, operand0=col, op1=nl.subtract,
                                  operand1=y, reverse1=True)
        return t
    np.testing.assert_allclose(run(body, a, b, c), b - a * c, rtol=1e-5, atol=1e-6)

    def both_psum(x, y, col):
        p, q = ps(x.shape), ps(x.shape)
        nisa.tensor_copy(dst=p, src=x)
        nisa.tensor_copy(dst=q, src=y)
        nisa.scalar_tensor_tensor(dst=sb(x.shape), data=p, op0=nl.add, operand0=1.0, op1=nl.add,
                                  operand1=q)
        return x
    with pytest.raises(simulate.ValidationError, match="data and operand1 cannot both be in PSUM"):
        run(both_psum, a, b, c)

    def bitvec(x, y, col):
        nisa.scalar_tensor_tensor(dst=sb(x.shape), data=x, op0=nl.bitwise_or, operand0=1,
                                  op1=nl.add, operand1=y)
        return x
    with pytest.raises(simulate.ValidationError, match=r"op0=nl.bitwise_or is not an ALU operator"):
        run(bitvec, a, b, c)


def test_reciprocal(rng):
    a = randn(rng, 3, 17)
    a[0, 0] = 0.0

    def body(x):
        t = sb(x.shape, nl.bfloat16)
        nisa.reciprocal(dst=t, data=x)
        return t
    with np.errstate(divide="ignore"):
        np.testing.assert_array_equal(run(body, a), (1 / a).astype(ml_dtypes.bfloat16))
    assert events("reciprocal")[0].engine == "vector"


def test_tensor_copy_predicated(rng):
    a, old = randn(rng, 5, 8), randn(rng, 5, 8)
    pred = (rng.random((5, 8)) < 0.5).astype(np.uint8)

    def body(x, o, p, reverse=False, src=None):
        t = sb(x.shape)
        nisa.tensor_copy(dst=t, src=o)
        nisa.tensor_copy_predicated(dst=t, src=x if src is None else src, predicate=p,
                                    reverse_pred=reverse)
        return t
    np.testing.assert_array_equal(run(body, a, old, pred), np.where(pred != 0, a, old))
    np.testing.assert_array_equal(run(lambda x, o, p: body(x, o, p, True), a, old, pred),
                                  np.where(pred == 0, a, old))
    np.testing.assert_array_equal(run(lambda x, o, p: body(x, o, p, src=2.5), a, old, pred),
                                  np.where(pred != 0, np.float32(2.5), old))
    with pytest.raises(simulate.ValidationError, match="predicate must be uint8/uint16/uint32"):
        run(body, a, old, pred.astype(np.int32))
    with pytest.raises(simulate.ValidationError, match="src dtype bfloat16 must equal dst dtype"):
        run(body, a.astype(ml_dtypes.bfloat16), old, pred)


def test_operand_placement_rules():
    """Compute-engine operands start at partition 0/32/64/96 (by size) and GpSimd has no PSUM."""
    def misaligned(x):
        t = sb((8, 4))
        nisa.tensor_copy(dst=t[1:5, :], src=x[0:4, :])
        return t
    with pytest.raises(simulate.ValidationError, match="starts at partition 1"):
        run(misaligned, np.zeros((8, 4), np.float32))

    def gpsimd_psum(x):
        nisa.tensor_scalar(dst=ps((8, 4)), data=x, op0=nl.add, operand0=1.0,
                           engine=nisa.engine.gpsimd)
        return x
    with pytest.raises(simulate.ValidationError, match="GpSimd cannot access PSUM"):
        run(gpsimd_psum, np.zeros((8, 4), np.float32))
