"""Operator tokens: ALU ops (``op=`` of tensor_tensor/tensor_scalar/tensor_reduce) and activation
functions (``op=`` of activation). Arithmetic is done in fp32 as on the engines.

Each token is also callable as the ``nl`` convenience function of the same name (``nl.add(x, y)``
returns a new tile); ``simulate.language_ops`` installs that behaviour.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np


@dataclass(frozen=True, eq=False)
class Op:
    """An operator token. ``fn`` works on float32 (or integer, for bitvec ops) NumPy arrays."""

    name: str
    fn: Callable
    arity: int                     # 1 or 2
    kind: str                      # "arith" | "compare" | "logical" | "bitvec" | "activation"
    reduce_identity: Optional[float] = None   # set for legal reduction ops
    convenience: Optional[Callable] = None    # nl.<name>(...) implementation, set later
    alu_unary: bool = False        # activation token that is also a unary ALU op (tensor_scalar)
    min_nc: int = 2                # first NeuronCore version with this operator

    def __call__(self, *args, **kwargs):
        if self.convenience is None:
            raise TypeError(f"nl.{self.name} is an operator token here; "
                            f"use it as op= of an nki.isa instruction")
        return self.convenience(*args, **kwargs)

    def __repr__(self):
        return f"nl.{self.name}"

    @property
    def __signature__(self):
        """The signature of the ``nl.<name>(...)`` convenience function."""
        import inspect
        if self.convenience is None:
            raise ValueError(f"nl.{self.name} has no convenience function")
        return inspect.signature(self.convenience)

    @property
    def is_reduction(self) -> bool:
        return self.reduce_identity is not None


def _f(fn):
    def apply(*xs):
        with np.errstate(all="ignore"):
            return fn(*xs)
    return apply


def _bool_f32(fn):
    return _f(lambda a, b: fn(a, b).astype(np.float32))


_ALU = [
    Op("add", _f(np.add), 2, "arith", 0.0),
    Op("subtract", _f(np.subtract), 2, "arith", 0.0),
    Op("multiply", _f(np.multiply), 2, "arith", 1.0),
    Op("divide", _f(np.divide), 2, "arith"),
    Op("maximum", _f(np.maximum), 2, "arith", -np.inf),
    Op("minimum", _f(np.minimum), 2, "arith", np.inf),
    Op("power", _f(np.power), 2, "arith"),
    Op("abs_max", _f(lambda a, b: np.maximum(np.abs(a), np.abs(b))), 2, "arith", min_nc=4),
    Op("abs_min", _f(lambda a, b: np.minimum(np.abs(a), np.abs(b))), 2, "arith", min_nc=4),
    Op("equal", _bool_f32(np.equal), 2, "compare"),
    Op("not_equal", _bool_f32(np.not_equal), 2, "compare"),
    Op("greater", _bool_f32(np.greater), 2, "compare"),
    Op("greater_equal", _bool_f32(np.greater_equal), 2, "compare"),
    Op("less", _bool_f32(np.less), 2, "compare"),
    Op("less_equal", _bool_f32(np.less_equal), 2, "compare"),
    Op("logical_and", _bool_f32(lambda a, b: (a != 0) & (b != 0)), 2, "logical", 1.0),
    Op("logical_or", _bool_f32(lambda a, b: (a != 0) | (b != 0)), 2, "logical", 0.0),
    Op("logical_xor", _bool_f32(lambda a, b: (a != 0) ^ (b != 0)), 2, "logical", 0.0),
    Op("bitwise_and", np.bitwise_and, 2, "bitvec", -1),
    Op("bitwise_or", np.bitwise_or, 2, "bitvec", 0),
    Op("bitwise_xor", np.bitwise_xor, 2, "bitvec", 0),
    Op("left_shift", np.left_shift, 2, "bitvec"),
    Op("right_shift", lambda a, b: (a.view(np.uint32) >> b.astype(np.uint32)).view(a.dtype)
       if a.dtype.itemsize == 4 else np.right_shift(a, b), 2, "bitvec"),
    Op("invert", np.invert, 1, "bitvec"),
    Op("average", _f(lambda a, b: (a + b) / 2), 2, "arith"),   # tensor_partition_reduce only
    Op("mod", _f(np.mod), 2, "arith"),          # simulation only in NKI
    Op("fmod", _f(np.fmod), 2, "arith"),        # simulation only in NKI
]

_ACTIVATIONS = [
    Op("copy", _f(lambda x: x), 1, "activation"),
    Op("bypass", _f(lambda x: x), 1, "activation"),
    Op("exp", _f(np.exp), 1, "activation"),
    Op("log", _f(np.log), 1, "activation"),
    Op("tanh", _f(np.tanh), 1, "activation"),
    Op("sigmoid", _f(lambda x: 1.0 / (1.0 + np.exp(-x))), 1, "activation"),
    Op("relu", _f(lambda x: np.maximum(x, 0)), 1, "activation", alu_unary=True),
    Op("square", _f(np.square), 1, "activation", alu_unary=True),
    Op("sqrt", _f(np.sqrt), 1, "activation"),
    Op("rsqrt", _f(lambda x: 1.0 / np.sqrt(x)), 1, "activation", alu_unary=True),
    Op("reciprocal", _f(lambda x: 1.0 / x), 1, "activation", alu_unary=True),
    Op("abs", _f(np.abs), 1, "activation", alu_unary=True),
    Op("negative", _f(np.negative), 1, "activation"),
    Op("sign", _f(np.sign), 1, "activation"),
    Op("silu", _f(lambda x: x / (1.0 + np.exp(-x))), 1, "activation"),
    Op("gelu", _f(lambda x: 0.5 * x * (1.0 + _erf(x / np.sqrt(2.0)))), 1, "activation"),
    Op("gelu_apprx_tanh", _f(lambda x: 0.5 * x * (1.0 + np.tanh(0.7978845608 * (x + 0.044715 * x ** 3)))),
       1, "activation"),
    Op("softplus", _f(lambda x: np.logaddexp(0.0, x)), 1, "activation"),
    Op("erf", _f(lambda x: _erf(x)), 1, "activation"),
    Op("gelu_dx", _f(lambda x: 0.5 * (1.0 + _erf(x / np.sqrt(2.0)))
                      + x * np.exp(-0.5 * x * x) / np.sqrt(2.0 * np.pi)), 1, "activation"),
    Op("gelu_apprx_sigmoid", _f(lambda x: x / (1.0 + np.exp(-1.702 * x))), 1, "activation"),
    Op("gelu_apprx_sigmoid_dx", _f(lambda x: _sig(1.702 * x) * (1.0 + 1.702 * x * (1.0 - _sig(1.702 * x)))),
       1, "activation"),
    Op("prelu", _f(lambda x, alpha=0.0: np.where(x >= 0, x, alpha * x)), 1, "activation"),
    Op("silu_dx", _f(lambda x: (1.0 + np.exp(-x) * (1.0 + x)) / (1.0 + np.exp(-x)) ** 2), 1,
       "activation"),
    Op("erf_dx", _f(lambda x: 2.0 / np.sqrt(np.pi) * np.exp(-x * x)), 1, "activation"),
    Op("mish", _f(lambda x: x * np.tanh(np.logaddexp(0.0, x))), 1, "activation"),
    Op("sin", _f(np.sin), 1, "activation"),
    Op("cos", _f(np.cos), 1, "activation"),
    Op("tan", _f(np.tan), 1, "activation"),
    Op("arctan", _f(np.arctan), 1, "activation"),
    Op("ceil", _f(np.ceil), 1, "activation"),
    Op("floor", _f(np.floor), 1, "activation"),
    Op("trunc", _f(np.trunc), 1, "activation"),
]


def _sig(x):
    return 1.0 / (1.0 + np.exp(-x))


def _erf(x):
    # Abramowitz-Stegun 7.1.26 is too coarse for tests; use math.erf vectorised.
    import math
    return np.vectorize(math.erf, otypes=[np.float32])(x) if np.ndim(x) else math.erf(x)


ALU_OPS = {op.name: op for op in _ALU}
ACTIVATIONS = {op.name: op for op in _ACTIVATIONS}
ALL_OPS = {**ALU_OPS, **ACTIVATIONS}
