"""Resolve a tensor operand when an instruction runs: bounds, dynamic offsets, read and write.

A static view becomes a zero-copy strided NumPy view of its storage after a bounds check.
A scalar dynamic offset moves the start by ``value * row_elems`` (value read now, from SBUF).
A vector dynamic offset gathers/scatters one row per partition: element ``(w, rest...)`` is
``offset + index[w] * row_elems + sum(rest * steps[1:])``; the pattern's first step is ignored.

Out-of-bounds handling follows ``oob_mode``: ``"error"`` raises ``OutOfBoundsError``; ``"skip"``
drops the offending rows (vector) or the whole access (scalar), leaving the destination untouched.
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from nki_kernels import access_patterns as aps

from . import context
from .errors import OutOfBoundsError, ValidationError
from .tensor import ndarray


_BITS = {n: np.dtype(f"u{n}") for n in (1, 2, 4, 8)}
_DIRECT = {}          # dtype -> False when np.ndarray cannot view a buffer in it directly


class Resolved:
    """An operand ready to read or write; ``row_mask`` marks the rows that take part."""

    def __init__(self, tensor: ndarray, offset: int, indices: Optional[np.ndarray] = None,
                 row_mask: Optional[np.ndarray] = None, skipped: bool = False):
        self.tensor = tensor
        self.offset = offset          # resolved start (static/scalar)
        self.indices = indices        # flat element indices (vector offsets), shape = tensor.shape
        self.row_mask = row_mask      # bool (shape[0],) or None = all rows
        self.skipped = skipped        # scalar offset out of bounds under oob_mode.skip

    shape = property(lambda self: self.tensor.shape)
    dtype = property(lambda self: self.tensor._dtype)
    buffer = property(lambda self: self.tensor._storage.buffer)

    @property
    def indirect(self) -> Optional[str]:
        dyn = self.tensor._dynamic
        return dyn.kind if dyn is not None else None

    def _flat(self) -> np.ndarray:
        return self.tensor._storage.elements(self.tensor._dtype)

    def _strided(self) -> np.ndarray:
        """A zero-copy view of the (bounds-checked) static access of the storage."""
        flat, t = self._flat(), self.tensor
        itemsize = flat.itemsize
        strides = [s * itemsize for s in t.strides]
        if _DIRECT.get(flat.dtype, True):
            try:                                        # one constructor call (hot)
                return np.ndarray(t.shape, flat.dtype, flat, self.offset * itemsize, strides)
            except (TypeError, ValueError):
                _DIRECT[flat.dtype] = False             # a dtype NumPy will not stride directly
        bits = flat.view(_BITS[itemsize])               # a view type NumPy can stride for any dtype
        view = np.ndarray(t.shape, bits.dtype, bits, self.offset * itemsize, strides)
        return view.view(flat.dtype)

    def read(self) -> np.ndarray:
        """The operand's values, shape ``tensor.shape`` (rows outside ``row_mask`` hold zeros;
        an operand ``dropped`` under oob_mode.skip is never read)."""
        if self.indices is not None:
            if self.row_mask is None:
                return self._flat()[self.indices]
            out = np.zeros(self.shape, self.dtype)
            out[self.row_mask] = self._flat()[self.indices[self.row_mask]]
            return out
        return self._strided().copy()

    def read_as(self, dtype) -> np.ndarray:
        """``read()`` converted to ``dtype`` (NumPy's cast), one copy for a static access."""
        if self.indices is None:
            return self._strided().astype(dtype)
        return self.read().astype(dtype)

    def flat_indices(self) -> np.ndarray:
        """Flat element indices (in the operand's dtype) of every element, shape ``tensor.shape``."""
        if self.indices is not None:
            return self.indices
        t = self.tensor
        return aps.AccessPattern.from_strides(t.shape, t.strides, self.offset).indices()

    def flag_view(self, flags: np.ndarray) -> Optional[np.ndarray]:
        """A writable bool view, shape ``tensor.shape``, of the entries of ``flags`` (one per
        storage element in the operand's dtype) this static access covers; None for an indexed
        (vector offset) access."""
        if self.indices is not None:
            return None
        t = self.tensor
        return np.ndarray(t.shape, np.bool_, flags, self.offset, t.strides)

    def write(self, values: np.ndarray, row_mask: Optional[np.ndarray] = None) -> None:
        """Store ``values`` (already of the operand's dtype and shape) in the rows taking part."""
        if self.skipped:
            return
        storage = self.tensor._storage
        if storage.mm_written is not None:          # a non-matmul write ends PSUM accumulation
            view = self.flag_view(storage.mm_written)
            if view is None:
                storage.mm_written[self.flat_indices().ravel()] = False
            else:
                view[...] = False
        mask = rows_in_both(self.row_mask, row_mask)
        if getattr(values, "shape", None) != self.shape:
            values = np.broadcast_to(values, self.shape)
        if self.indices is not None:
            idx = self.indices if mask is None else self.indices[mask]
            self._flat()[idx] = values if mask is None else values[mask]
            return
        view = self._strided()
        if mask is None:
            view[...] = values
        else:
            view[mask] = values[mask]

    def pattern(self):
        t = self.tensor
        return tuple(zip(t.strides, t.shape))


def dropped(*operands: Resolved) -> bool:
    """True when oob_mode.skip dropped one of an instruction's operands (a scalar offset out of
    bounds): the whole access then moves nothing, the destination is left as it was."""
    return any(r.skipped for r in operands)


def rows_in_both(a, b):
    """The rows two row masks (bool, None = every row) both keep."""
    if a is None:
        return b
    if b is None:
        return a
    return a & b


def elems_in_rows(mask, size: int, rows: int) -> int:
    """Elements of a ``size``-element operand of ``rows`` rows that a row mask keeps."""
    return size if mask is None else int(mask.sum()) * (size // max(1, rows))


def resolve(t, op: str, role: str, oob_mode: str = "error") -> Resolved:
    """Resolve operand ``role`` of instruction ``op``; raise on out-of-bounds per ``oob_mode``."""
    if not isinstance(t, ndarray):
        context.fail(ValidationError, f"expected an nl.ndarray, got {type(t).__name__}",
                     op=op, operand=role)
    label = f"{role}={t.name}" if t.name else role
    if t._storage.shared_region is not None:     # placed, partly overlapping other tensors
        t._storage.shared_region.sync()
    dyn = t._dynamic
    flat_size = t._storage.elements(t._dtype).size
    if dyn is None:
        lo, hi = aps.extent(zip(t._strides, t._shape), t._offset)   # no pattern object built
        if lo < 0 or hi >= flat_size:
            _check_static(aps.AccessPattern.from_strides(t.shape, t.strides, t.offset),
                          flat_size, op, label)
        return Resolved(t, t.offset)
    ap = aps.AccessPattern.from_strides(t.shape, t.strides)        # steps only: starts below
    if dyn.kind == "scalar":
        value = _scalar_value(dyn.source, op)
        start = t.offset + value * dyn.row_elems
        lo, hi = ap.with_offset(start).extent
        if lo < 0 or hi >= flat_size:
            if oob_mode == "skip":
                return Resolved(t, start, skipped=True)
            context.fail(OutOfBoundsError,
                         f"scalar_offset={value} moves the access to flat indices [{lo}, {hi}], "
                         f"tensor has {flat_size} elements", op=op, operand=label)
        return Resolved(t, start)
    rows = _vector_values(dyn.source, op)
    inner = (aps.AccessPattern(ap.pattern[1:]).indices().ravel() if len(ap.pattern) > 1
             else np.zeros(1, np.int64))        # element offsets inside a row (steps may be < 0)
    starts = t.offset + rows * dyn.row_elems
    indices = (starts[:, None] + inner[None, :]).reshape(t.shape)
    lo_row, hi_row = starts + inner.min(), starts + inner.max()
    ok = (lo_row >= 0) & (hi_row < flat_size)
    if not ok.all():
        if oob_mode != "skip":
            w = int(np.flatnonzero(~ok)[0])
            context.fail(OutOfBoundsError,
                         f"vector_offset row {w} = {int(rows[w])} reaches flat indices "
                         f"[{int(lo_row[w])}, {int(hi_row[w])}], tensor has {flat_size} elements "
                         f"(out-of-bound indirect access)", op=op, operand=label)
        return Resolved(t, t.offset, indices=indices, row_mask=ok)
    return Resolved(t, t.offset, indices=indices)


def _check_static(ap, flat_size, op, label):
    try:
        aps.check_bounds(ap, flat_size)
    except aps.AccessPatternError as err:
        context.fail(OutOfBoundsError, str(err), op=op, operand=label)


def _scalar_value(source, op) -> int:
    if isinstance(source, (int, np.integer)):
        return int(source)
    if hasattr(source, "read_value"):          # a register
        return int(source.read_value())
    return int(resolve(source, op, "scalar_offset").read().flat[0])


def _vector_values(source, op) -> np.ndarray:
    """The row index of each partition: ``source`` must be a [P, 1] tile (one index per
    partition; a wider tile has no documented meaning for ``dma_copy``)."""
    if isinstance(source, ndarray) and (len(source.shape) != 2 or source.shape[1] != 1):
        context.fail(ValidationError, f"vector_offset must be a [P, 1] tile of row indices (one per "
                     f"partition), got shape {tuple(source.shape)}", op=op, operand="vector_offset")
    return resolve(source, op, "vector_offset").read()[:, 0].astype(np.int64)
