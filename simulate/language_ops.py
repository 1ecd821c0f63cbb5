"""``nki.language`` convenience ops (NKI >= 0.3): each allocates its result tile and lowers to
``nki.isa`` instructions, so it is traced like hand-written ISA code.

Covered: load, store, copy, transpose, matmul, element-wise ALU ops (``nl.add(x, y)``, with a tile
or a number as y), activation functions (``nl.exp(x)``), sum/max/min/mean/prod over trailing free
axes, softmax over the last axis, where. Results go to SBUF (PSUM for matmul/transpose).
"""

from __future__ import annotations

import numpy as np

from . import isa
from .ops import ACTIVATIONS, ALU_OPS
from .tensor import MemoryRegion, ndarray

__all__ = ["load", "store", "copy_tile", "transpose", "matmul", "sum", "max", "min", "mean", "prod",
           "softmax", "where"]


def _sbuf(shape, dtype, name=""):
    return ndarray(shape, dtype, buffer=MemoryRegion.sbuf, name=name)


def load(src, dtype=None):
    """HBM -> a new SBUF tile (cast through fp32 when ``dtype`` differs)."""
    t = _sbuf(src.shape, dtype or src.dtype, "load")
    isa.dma_copy(dst=t, src=src)
    return t


def store(dst, value):
    """A tile -> ``dst`` (HBM); PSUM values are evicted through SBUF first."""
    if value.buffer == MemoryRegion.psum:
        value = copy_tile(value)
    isa.dma_copy(dst=dst, src=value)


def copy_tile(x, dtype=None):
    t = _sbuf(x.shape, dtype or x.dtype, "copy")
    isa.tensor_copy(dst=t, src=x)
    return t


def transpose(x):
    """[P, F] -> [F, P] in PSUM (TensorE)."""
    t = ndarray((x.shape[1], x.shape[0]), x.dtype, buffer=MemoryRegion.psum, name="transpose")
    isa.nc_transpose(dst=t, data=x)
    return t


def matmul(x, y, transpose_x=False):
    """x @ y into PSUM fp32: x [M, K] (or [K, M] with transpose_x), y [K, N]."""
    xT = x if transpose_x else copy_tile(transpose(x))
    out = ndarray((xT.shape[1], y.shape[1]), np.float32, buffer=MemoryRegion.psum, name="matmul")
    isa.nc_matmul(dst=out, stationary=xT, moving=y)
    return out


def _binary(token):
    def apply(x, y, dtype=None):
        out = _sbuf(x.shape, dtype or x.dtype, token.name)
        if isinstance(y, ndarray):
            isa.tensor_tensor(dst=out, data1=x, data2=y, op=token)
        else:
            isa.tensor_scalar(dst=out, data=x, op0=token, operand0=y)
        return out
    return apply


def _unary(token):
    def apply(x, dtype=None):
        out = _sbuf(x.shape, dtype or x.dtype, token.name)
        isa.activation(dst=out, op=token, data=x)
        return out
    return apply


def _reduce(token_name):
    def apply(x, axis, dtype=None, keepdims=False):
        axes = (axis,) if isinstance(axis, int) else tuple(axis)
        axes = tuple(a % x.ndim for a in axes)
        kept = [n if d not in axes else 1 for d, n in enumerate(x.shape)]
        shape = tuple(kept) if keepdims else tuple(n for d, n in enumerate(x.shape) if d not in axes)
        out = _sbuf(shape if len(shape) >= 2 else (x.shape[0], 1), dtype or x.dtype, token_name)
        isa.tensor_reduce(dst=out, op=ALU_OPS[token_name], data=x, axis=axes, keepdims=keepdims)
        return out
    return apply


sum = _reduce("add")            # noqa: A001 - NKI's names
max = _reduce("maximum")        # noqa: A001
min = _reduce("minimum")        # noqa: A001
prod = _reduce("multiply")


def mean(x, axis, dtype=None, keepdims=False):
    total = sum(x, axis, np.float32, keepdims)
    count = int(np.prod([x.shape[a % x.ndim] for a in ((axis,) if isinstance(axis, int) else axis)]))
    out = _sbuf(total.shape, dtype or x.dtype, "mean")
    isa.tensor_scalar(dst=out, data=total, op0=ALU_OPS["multiply"], operand0=1.0 / count)
    return out


def softmax(x, axis=-1):
    """Row softmax over the last (free) axis of a 2-D tile."""
    if axis % x.ndim != x.ndim - 1 or x.ndim != 2:
        raise ValueError("nl.softmax here takes a 2-D tile and axis=-1")
    negmax = _sbuf((x.shape[0], 1), np.float32, "negmax")
    isa.tensor_reduce(dst=negmax, op=ALU_OPS["maximum"], data=x, axis=1, negate=True, keepdims=True)
    e, total = _sbuf(x.shape, np.float32, "exp"), _sbuf((x.shape[0], 1), np.float32, "sum")
    isa.activation(dst=e, op=ACTIVATIONS["exp"], data=x, bias=negmax, reduce_op=ALU_OPS["add"],
                   reduce_res=total, reduce_cmd=isa.reduce_cmd.reset_reduce)
    isa.reciprocal(dst=total, data=total)
    out = _sbuf(x.shape, x.dtype, "softmax")
    isa.tensor_scalar(dst=out, data=e, op0=ALU_OPS["multiply"], operand0=total)
    return out


def where(condition, x, y):
    """x where condition != 0 else y (condition: an integer tile)."""
    out = copy_tile(y)
    isa.tensor_copy_predicated(dst=out, src=x, predicate=condition)
    return out


def _attach():
    for token in ALU_OPS.values():
        if token.arity == 2:
            object.__setattr__(token, "convenience", _binary(token))
    for token in ACTIVATIONS.values():
        object.__setattr__(token, "convenience", _unary(token))


_attach()
