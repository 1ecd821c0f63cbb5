"""``nki.language`` convenience ops (NKI >= 0.3, "experimental"): each allocates its result tile and
lowers to ``nki.isa`` instructions, so it is traced and validated like hand-written ISA code.

- ``load``/``store``/``load_transpose2d`` (DMA), ``copy`` (tensor_copy), ``transpose`` and
  ``matmul`` (TensorE, result in PSUM).
- Element-wise: every ALU token ``nl.add(x, y, dtype=None)`` and activation token
  ``nl.exp(x, dtype=None)`` is callable. ``x``/``y`` are tiles or numbers; shapes broadcast
  along free dims (size-1 free dims, or a [P, 1] column as a tensor_scalar operand); partitions
  must match (``broadcast_to`` replicates a 1-partition tile). Comparisons and logical ops
  default to ``dtype=nl.bool_``; otherwise the result dtype is promoted from the inputs.
- Reductions ``sum/max/min/mean/prod/var/all(x, axis, dtype=None, keepdims=False)`` over
  trailing free axes; ``softmax(x, axis=-1)`` of a 2-D tile (the row recipe of nki-api.md §6);
  ``where``, ``broadcast_to``, ``expand_dims``; ``rms_norm(x, w, axis, n)`` of a 2-D tile over its
  free axis, ``dropout(x, rate)`` (VectorE PRNG), ``gather_flattened(data, indices)`` (per
  partition, ``nc_n_gather``).
Results live in SBUF (PSUM for ``matmul``/``transpose``).
"""

from __future__ import annotations

import builtins

import numpy as np

from . import dtypes, isa
from .ops import ACTIVATIONS, ALU_OPS
from .tensor import MemoryRegion, ndarray

__all__ = ["load", "store", "load_transpose2d", "copy_tile", "transpose", "matmul", "sum", "max",
           "min", "mean", "prod", "var", "all", "softmax", "where", "broadcast_to", "expand_dims",
           "logical_not", "rms_norm", "dropout", "gather_flattened"]

BOOL_RESULT = ("compare", "logical")


def _sbuf(shape, dtype, name=""):
    return ndarray(shape, dtype, buffer=MemoryRegion.sbuf, name=name)


def _psum(shape, dtype, name=""):
    return ndarray(shape, dtype, buffer=MemoryRegion.psum, name=name)


def _is_tile(x) -> bool:
    return isinstance(x, ndarray)


# -- data movement ---------------------------------------------------------------------------
def load(src, dtype=None):
    """A tensor (HBM or SBUF) -> a new SBUF tile (converted through fp32 when ``dtype`` differs)."""
    t = _sbuf(src.shape, dtype or src.dtype, "load")
    isa.dma_copy(dst=t, src=src)
    return t


def store(dst, value):
    """A tile -> ``dst`` (HBM); PSUM values are evicted through SBUF first."""
    if value.buffer == MemoryRegion.psum:
        value = copy_tile(value, dst.dtype)
    isa.dma_copy(dst=dst, src=value)


def copy_tile(x, dtype=None):
    """``nl.copy``: a new SBUF tile equal to ``x`` (bit-exact when the dtype is kept)."""
    t = _sbuf(x.shape, dtype or x.dtype, "copy")
    isa.tensor_copy(dst=t, src=x)
    return t


def transpose(x, dtype=None):
    """2-D [P, F] -> [F, P] in PSUM (TensorE, <= 128 x 128)."""
    if x.ndim != 2:
        raise ValueError(f"nl.transpose takes a 2-D tile, got shape {x.shape}")
    t = _psum((x.shape[1], x.shape[0]), x.dtype, "transpose")
    isa.nc_transpose(dst=t, data=x)
    return t if dtype in (None, x.dtype) else copy_tile(t, dtype)


def load_transpose2d(src, dtype=None):
    """HBM [P, F] -> SBUF [F, P] (a load, a TensorE transpose, an eviction)."""
    return copy_tile(transpose(load(src)), dtype)


def matmul(x, y, transpose_x=False):
    """``x @ y`` (``x.T @ y`` with ``transpose_x``) into a new fp32 PSUM tile. x [M, K] <= 128 x 128
    (without ``transpose_x`` a TensorE transpose is inserted), y [K, N <= 512]."""
    xT = x if transpose_x else copy_tile(transpose(x))
    out = _psum((xT.shape[1], y.shape[1]), np.float32, "matmul")
    isa.nc_matmul(dst=out, stationary=xT, moving=y)
    return out


# -- element-wise ----------------------------------------------------------------------------
def _promote(x, y):
    """Result dtype of a binary op: float beats int, wider beats narrower, bf16+fp16 -> fp32."""
    kinds = [np.dtype(t.dtype) if _is_tile(t) else None for t in (x, y)]
    tiles = [k for k in kinds if k is not None]
    if len(tiles) == 1:
        other = y if kinds[0] is not None else x
        if dtypes.is_int(tiles[0]) and isinstance(other, float):
            return dtypes.float32
        return tiles[0]
    a, b = tiles
    if a == b:
        return a
    fa, fb = dtypes.is_float(a), dtypes.is_float(b)
    if fa != fb:
        return a if fa else b
    if a.itemsize != b.itemsize:
        return a if a.itemsize > b.itemsize else b
    return dtypes.float32 if fa else dtypes.int32


def _broadcast_free(t, shape):
    """View of tile ``t`` broadcast (size-1 free dims) to ``shape`` with the same partitions."""
    if t.shape == tuple(shape):
        return t
    if t.ndim != len(shape):
        raise ValueError(f"cannot broadcast {t.shape} to {tuple(shape)}: ranks differ")
    if t.shape[0] != shape[0]:
        raise ValueError(f"partition sizes differ ({t.shape[0]} vs {shape[0]}); use "
                         f"nl.broadcast_to for a 1-partition tile")
    for dim in range(1, len(shape)):
        if t.shape[dim] != shape[dim]:
            if t.shape[dim] != 1:
                raise ValueError(f"cannot broadcast {t.shape} to {tuple(shape)}")
            t = t.broadcast(dim, shape[dim])
    return t


def _is_column(t, shape):
    return t.ndim == len(shape) and t.shape[0] == shape[0] and t.size == t.shape[0]


def _binary(token):
    def apply(x, y, dtype=None):
        if not _is_tile(x) and not _is_tile(y):
            raise TypeError(f"nl.{token.name} needs at least one tile")
        if dtype is None:
            dtype = dtypes.bool_ if token.kind in BOOL_RESULT else _promote(x, y)
        if _is_tile(x) and _is_tile(y):
            shape = tuple(np.broadcast_shapes(x.shape, y.shape))
            for a, b, rev in ((x, y, False), (y, x, True)):
                if a.shape == shape and b.shape != shape and _is_column(b, shape):
                    out = _sbuf(shape, dtype, token.name)
                    isa.tensor_scalar(dst=out, data=a, op0=token, operand0=b, reverse0=rev)
                    return out
            out = _sbuf(shape, dtype, token.name)
            isa.tensor_tensor(dst=out, data1=_broadcast_free(x, shape),
                              data2=_broadcast_free(y, shape), op=token)
            return out
        tile, number, rev = (x, y, False) if _is_tile(x) else (y, x, True)
        out = _sbuf(tile.shape, dtype, token.name)
        isa.tensor_scalar(dst=out, data=tile, op0=token, operand0=number, reverse0=rev)
        return out
    apply.__name__ = token.name
    apply.__doc__ = f"nl.{token.name}(x, y, dtype=None): element-wise, returns a new SBUF tile."
    return apply


def _unary(token):
    def apply(x, dtype=None):
        out = _sbuf(x.shape, dtype or x.dtype, token.name)
        if token.kind == "bitvec":
            isa.tensor_scalar(dst=out, data=x, op0=token, operand0=None)
        else:
            isa.activation(dst=out, op=token, data=x)
        return out
    apply.__name__ = token.name
    apply.__doc__ = f"nl.{token.name}(x, dtype=None): element-wise, returns a new SBUF tile."
    return apply


def logical_not(x, dtype=dtypes.bool_):
    """1 where ``x == 0`` else 0."""
    out = _sbuf(x.shape, dtype, "logical_not")
    isa.tensor_scalar(dst=out, data=x, op0=ALU_OPS["equal"], operand0=0.0)
    return out


# -- reductions ------------------------------------------------------------------------------
def _axes(x, axis):
    axes = (axis,) if isinstance(axis, (int, np.integer)) else tuple(axis)
    return tuple(sorted(int(a) % x.ndim for a in axes))


def _reduced_shape(x, axes, keepdims):
    if keepdims:
        return tuple(1 if d in axes else n for d, n in enumerate(x.shape))
    shape = tuple(n for d, n in enumerate(x.shape) if d not in axes)
    return shape if len(shape) >= 2 else (x.shape[0], 1)


def _reduce(token_name, default_dtype=None):
    def apply(x, axis, dtype=None, keepdims=False):
        axes = _axes(x, axis)
        out = _sbuf(_reduced_shape(x, axes, keepdims), dtype or default_dtype or x.dtype,
                    token_name)
        isa.tensor_reduce(dst=out, op=ALU_OPS[token_name], data=x, axis=axes, keepdims=keepdims)
        return out
    return apply


sum = _reduce("add")            # noqa: A001 - NKI's names
max = _reduce("maximum")        # noqa: A001
min = _reduce("minimum")        # noqa: A001
prod = _reduce("multiply")
all = _reduce("logical_and", dtypes.bool_)    # noqa: A001


def mean(x, axis, dtype=None, keepdims=False):
    """Sum over ``axis`` times 1/count (fp32 math)."""
    total = sum(x, axis, np.float32, keepdims)
    count = int(np.prod([x.shape[a] for a in _axes(x, axis)]))
    out = _sbuf(total.shape, dtype or x.dtype, "mean")
    isa.tensor_scalar(dst=out, data=total, op0=ALU_OPS["multiply"], operand0=1.0 / count)
    return out


def var(x, axis, dtype=None, keepdims=False):
    """Population variance over trailing ``axis``: mean of squared deviations (fp32 math)."""
    axes = _axes(x, axis)
    kept = int(np.prod(x.shape[1:axes[0]], dtype=np.int64))
    x3 = x.reshape((x.shape[0], kept, x.size // x.shape[0] // kept))
    m = mean(x3, 2, np.float32, keepdims=True)
    diff = _sbuf(x3.shape, np.float32, "var_diff")
    isa.tensor_tensor(dst=diff, data1=x3, data2=m.broadcast(2, x3.shape[2]),
                      op=ALU_OPS["subtract"])
    isa.activation(dst=diff, op=ACTIVATIONS["square"], data=diff)
    out = mean(diff, 2, dtype or x.dtype)
    shape = _reduced_shape(x, axes, keepdims)
    return out if out.shape == shape else out.reshape(shape)


def softmax(x, axis=-1, dtype=None):
    """Row softmax of a 2-D tile over its free axis: max (negated) -> exp with the row sum ->
    reciprocal -> scale (fp32 intermediates)."""
    if x.ndim != 2 or axis % x.ndim != 1:
        raise ValueError(f"nl.softmax here takes a 2-D tile and axis=-1 (got {x.shape}, "
                         f"axis={axis})")
    P = x.shape[0]
    negmax = _sbuf((P, 1), np.float32, "negmax")
    isa.tensor_reduce(dst=negmax, op=ALU_OPS["maximum"], data=x, axis=1, negate=True,
                      keepdims=True)
    e, total = _sbuf(x.shape, np.float32, "exp"), _sbuf((P, 1), np.float32, "sum")
    isa.activation(dst=e, op=ACTIVATIONS["exp"], data=x, bias=negmax, reduce_op=ALU_OPS["add"],
                   reduce_res=total, reduce_cmd=isa.reduce_cmd.reset_reduce)
    isa.reciprocal(dst=total, data=total)
    out = _sbuf(x.shape, dtype or x.dtype, "softmax")
    isa.tensor_scalar(dst=out, data=e, op0=ALU_OPS["multiply"], operand0=total)
    return out


def rms_norm(x, w, axis, n, epsilon=1e-06, dtype=None, compute_dtype=None):
    """``x / sqrt(sum(x**2) / n + epsilon) * w`` over the free axis of a 2-D tile (``w``: a tile
    of x's shape, or [1, F] broadcast over partitions); fp32 (or ``compute_dtype``) inside."""
    if x.ndim != 2 or axis % x.ndim != 1:
        raise ValueError(f"nl.rms_norm here takes a 2-D tile and axis=1 (got {x.shape}, "
                         f"axis={axis})")
    P, F = x.shape
    if not isinstance(n, (int, np.integer)) or n < 1:
        raise ValueError(f"n={n!r} must be a positive count of values")
    cdt = compute_dtype or np.float32
    sq, total = _sbuf((P, F), cdt, "rms_sq"), _sbuf((P, 1), np.float32, "rms_sum")
    isa.activation(dst=sq, op=ACTIVATIONS["square"], data=x, reduce_op=ALU_OPS["add"],
                   reduce_res=total, reduce_cmd=isa.reduce_cmd.reset_reduce)
    isa.tensor_scalar(dst=total, data=total, op0=ALU_OPS["multiply"], operand0=1.0 / n,
                      op1=ALU_OPS["add"], operand1=float(epsilon))
    isa.activation(dst=total, op=ACTIVATIONS["rsqrt"], data=total)
    normed = _sbuf((P, F), cdt, "rms_normed")
    isa.tensor_scalar(dst=normed, data=x, op0=ALU_OPS["multiply"], operand0=total)
    out = _sbuf((P, F), dtype or x.dtype, "rms_norm")
    isa.tensor_tensor(dst=out, data1=normed, data2=_broadcast_free(w, (P, F)) if w.shape[0] == P
                      else broadcast_to(w, (P, F)), op=ALU_OPS["multiply"])
    return out


def dropout(x, rate, dtype=None):
    """Zero each element of ``x`` with probability ``rate`` (a number or a [P, 1] tile)."""
    out = _sbuf(x.shape, x.dtype, "dropout")
    isa.dropout(dst=out, data=x, prob=rate)
    return out if dtype is None or dtype == x.dtype else copy_tile(out, dtype)


def gather_flattened(data, indices, axis=0, dtype=None):
    """Per partition p: ``data[p].ravel()[indices[p, ...]]`` (uint32 indices, or cast to them)."""
    if axis != 0:
        raise ValueError(f"axis={axis}: gather_flattened gathers within each partition (axis 0)")
    if indices.dtype != dtypes.uint32:
        indices = copy_tile(indices, dtypes.uint32)
    out = _sbuf(indices.shape, data.dtype, "gather")
    isa.nc_n_gather(dst=out, data=data, indices=indices)
    return out if dtype is None or dtype == data.dtype else copy_tile(out, dtype)


# -- selection and shapes --------------------------------------------------------------------
def where(condition, x, y, dtype=None):
    """``x`` where ``condition != 0`` else ``y`` (x, y tiles or numbers; same shape as condition)."""
    shape = condition.shape
    dtype = dtype or (x.dtype if _is_tile(x) else y.dtype if _is_tile(y) else np.float32)
    pred = condition
    if condition.dtype not in (dtypes.uint8, dtypes.uint16, dtypes.uint32):
        pred = _sbuf(shape, dtypes.uint8, "where_pred")
        isa.tensor_scalar(dst=pred, data=condition, op0=ALU_OPS["not_equal"], operand0=0.0)
    out = _sbuf(shape, dtype, "where")
    if _is_tile(y):
        isa.tensor_copy(dst=out, src=_broadcast_free(y, shape))
    else:
        isa.memset(dst=out, value=y)
    src = _broadcast_free(x, shape) if _is_tile(x) else x
    if _is_tile(src) and src.dtype != dtype:
        src = copy_tile(src, dtype)
    isa.tensor_copy_predicated(dst=out, src=src, predicate=pred)
    return out


def expand_dims(x, axis):
    """A view with a size-1 free dim inserted at ``axis`` (not the partition dim)."""
    return x.expand_dim(axis % (x.ndim + 1))


def broadcast_to(x, shape, dtype=None):
    """A new SBUF tile of ``shape``: size-1 free dims repeated; a 1-partition float tile is
    replicated across partitions by a TensorE matmul with a ones row (exact)."""
    shape = tuple(int(n) for n in shape)
    if x.shape[0] == shape[0]:
        return copy_tile(_broadcast_free(x, shape), dtype)
    if x.shape[0] != 1 or not dtypes.is_float(x.dtype):
        raise ValueError(f"broadcast_to {x.shape} -> {shape}: partitions are replicated only "
                         f"from a 1-partition float tile")
    row = copy_tile(_broadcast_free(x, (1,) + shape[1:])).reshape((1, int(np.prod(shape[1:]))))
    ones = _sbuf((1, shape[0]), row.dtype, "ones")
    isa.memset(dst=ones, value=1.0)
    out = _sbuf((shape[0], row.shape[1]), dtype or x.dtype, "broadcast")
    for f0 in range(0, row.shape[1], 512):
        f1 = builtins.min(row.shape[1], f0 + 512)
        acc = _psum((shape[0], f1 - f0), np.float32, "broadcast_ps")
        isa.nc_matmul(dst=acc, stationary=ones, moving=row[:, f0:f1])
        isa.tensor_copy(dst=out[:, f0:f1], src=acc)
    return out.reshape(shape)


def _attach():
    for token in ALU_OPS.values():
        object.__setattr__(token, "convenience", _binary(token) if token.arity == 2
                           else _unary(token))
    for token in ACTIVATIONS.values():
        object.__setattr__(token, "convenience", _unary(token))
    object.__setattr__(ACTIVATIONS["copy"], "convenience", copy_tile)


_attach()
