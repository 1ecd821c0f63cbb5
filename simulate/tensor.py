"""``nl.ndarray``: a strided view (shape, element strides, offset, dtype) over one ``Storage``.

Views (indexing, ``slice``, ``permute``, ``reshape``, ``view(dtype)``, ``.ap``) share storage and copy
nothing. Partition rules of NKI Beta 2 on SBUF/PSUM tensors: dim 0 is the partition dimension and
stays dim 0; an integer index on dim 0 keeps a size-1 dim; an integer index on a free dim drops it
unless the result would have fewer than 2 dims. HBM tensors drop integer-indexed dims.

``.ap(pattern, offset, scalar_offset, vector_offset, indirect_dim, dtype)`` addresses the storage
directly (it ignores the view it is called on, except for its offset when ``offset`` is None and its
shape for the scale of a dynamic offset) and may not be applied again to its result.
"""

from __future__ import annotations

import enum
import math
import sys
import threading
from dataclasses import dataclass

import numpy as np

from nki_kernels import access_patterns as aps

from . import context, dtypes
from .errors import AccessError, OutOfBoundsError, ValidationError
from .memory import Storage


class MemoryRegion(enum.Enum):
    sbuf = "sbuf"
    psum = "psum"
    private_hbm = "private_hbm"
    shared_hbm = "shared_hbm"

    def __str__(self):
        return self.value


def buffer_name(buffer) -> str:
    if isinstance(buffer, MemoryRegion):
        return buffer.value
    if isinstance(buffer, str):
        raise TypeError(f"buffer={buffer!r}: string buffer names were removed in NKI 0.3.0; "
                        f"use nl.sbuf, nl.psum, nl.hbm or nl.shared_hbm")
    raise TypeError(f"buffer={buffer!r} is not an nl memory region")


@dataclass(frozen=True)
class DynSlice:
    """``nl.ds(start, size)``: the slice ``start:start+size``."""

    start: int
    size: int


@dataclass(frozen=True)
class DynamicOffset:
    """The runtime part of an ``.ap`` access: start moves by ``value * row_elems``."""

    kind: str                 # "scalar" | "vector"
    source: object            # ndarray (SBUF int tensor) or int
    indirect_dim: int
    row_elems: int            # prod(shape[indirect_dim+1:]) of the tensor .ap was called on


def _fail(cls, message, op=".ap", operand=None):
    context.fail(cls, message, op=op, operand=operand)


class ndarray:
    """An NKI tensor: ``ndarray(shape, dtype, buffer=nl.sbuf, name='', address=None)`` allocates."""

    def __init__(self, shape, dtype, buffer=MemoryRegion.sbuf, name: str = "", address=None):
        buf = buffer_name(buffer)
        shape = tuple(int(n) for n in (shape if isinstance(shape, (tuple, list)) else (shape,)))
        launch = context.current()
        dtype = dtypes.as_dtype(dtype)
        if not launch.precise_fp:
            dtype = dtypes.widened(dtype)
        _check_allocation(shape, dtype, buf, name, address)
        if buf == "shared_hbm" and launch.trace is not None:
            storage = _shared_hbm_storage(launch, shape, dtype, name)
        elif address is not None and buf in ("sbuf", "psum"):
            storage = launch.memory.place(shape, dtype, buf, name, address, lambda cls, msg: _fail(
                cls, msg, op="nl.ndarray", operand=name or None))
        else:
            frame = launch.loop_frames[-1] if launch.loop_frames else None
            storage = frame.take(shape, dtype, buf) if frame is not None else None
            if storage is None:
                storage = Storage.allocate(shape, dtype, buf, name, address)
                launch.memory.register(storage, lambda cls, msg: _fail(
                    cls, msg, op="nl.ndarray", operand=name or None))
                if frame is not None:
                    frame.keep(storage)
        if buf == "psum":
            storage.group_started = None      # a new tensor: its first matmul overwrites
        self._init_view(storage, shape, _contiguous_strides(shape), 0, dtype)

    # -- construction of views --------------------------------------------------------------
    def _init_view(self, storage, shape, strides, offset, dtype, is_ap=False, dynamic=None,
                   ints=False):
        """Set the view; ``ints``: shape and strides are Python ints and ``dtype`` a NumPy
        dtype already (views derived from a tensor: the hot path skips the conversions)."""
        self._storage = storage
        self._shape = tuple(shape) if ints else tuple(int(n) for n in shape)
        self._strides = tuple(strides) if ints else tuple(int(s) for s in strides)
        self._offset = int(offset)
        self._dtype = dtype if ints else np.dtype(dtype)
        self._is_ap = is_ap
        self._dynamic = dynamic
        return self

    @classmethod
    def _wrap(cls, array: np.ndarray, buffer: str = "shared_hbm", name: str = "") -> "ndarray":
        """An HBM tensor over a contiguous host array (writes go to the array)."""
        flat = array.reshape(-1)
        storage = Storage(flat, array.shape, buffer, name)
        return cls.__new__(cls)._init_view(storage, array.shape, _contiguous_strides(array.shape),
                                           0, array.dtype)

    def _derive(self, shape, strides, offset, dtype=None) -> "ndarray":
        if self._is_ap:
            _fail(AccessError, "cannot take a view of an access-pattern tensor", op="view")
        return ndarray.__new__(ndarray)._init_view(
            self._storage, shape, strides, offset, self._dtype if dtype is None else dtype,
            ints=dtype is None)

    # -- attributes ---------------------------------------------------------------------------
    shape = property(lambda self: self._shape)
    strides = property(lambda self: self._strides)
    offset = property(lambda self: self._offset)
    @property
    def dtype(self):
        """The element type: a NumPy dtype to the simulator, an ``nl`` dtype name to kernel code
        (whose NumPy attributes are an error there, as on the compiler)."""
        if context.in_simulator(sys._getframe(1).f_code.co_filename):
            return self._dtype
        return dtypes.nki_name(self._dtype)
    ndim = property(lambda self: len(self._shape))
    size = property(lambda self: math.prod(self._shape))
    name = property(lambda self: self._storage.name)

    @property
    def buffer(self) -> MemoryRegion:
        return MemoryRegion(self._storage.buffer)

    @property
    def on_chip(self) -> bool:
        return self._storage.buffer in ("sbuf", "psum")

    def get_pattern(self):
        """``[[stride, count], ...]`` of this view."""
        return [[s, n] for s, n in zip(self._strides, self._shape)]

    def access_pattern(self) -> aps.AccessPattern:
        return aps.AccessPattern.from_strides(self._shape, self._strides, self._offset, self._dtype)

    def is_contiguous(self) -> bool:
        return self._strides == _contiguous_strides(self._shape)

    def is_indirect(self) -> bool:
        return self._dynamic is not None

    def __repr__(self):
        kind = "ap " if self._is_ap else ""
        return (f"<nl.ndarray {kind}{self.name or '?'} {self._shape} {self._dtype.name} "
                f"@{self._storage.buffer} offset={self._offset} strides={self._strides}>")

    def __setitem__(self, key, value):
        raise TypeError("NKI tensors are written by instructions only: use nisa.dma_copy, "
                        "nisa.tensor_copy or nl.store, not item assignment")

    def __bool__(self):
        raise TypeError("the truth value of an NKI tensor is not known at trace time")

    # -- indexing -----------------------------------------------------------------------------
    def __getitem__(self, key) -> "ndarray":
        if not isinstance(key, tuple):
            key = (key,)
        if len(key) == 2 == len(self._shape) and type(key[0]) is slice and type(key[1]) is slice:
            return self._two_slices(*key)          # the common [a:b, c:d] of a 2-D tile, fast
        if any(k is Ellipsis for k in key):
            at = key.index(Ellipsis)
            key = key[:at] + (slice(None),) * (self.ndim - len(key) + 1) + key[at + 1:]
        if len(key) > self.ndim:
            _fail(IndexError, f"{len(key)} indices for a {self.ndim}-D tensor", op="index")
        key = key + (slice(None),) * (self.ndim - len(key))
        shape, strides, offset, dropped = [], [], self._offset, []
        for dim, (k, n, s) in enumerate(zip(key, self._shape, self._strides)):
            if isinstance(k, DynSlice):
                k = slice(k.start, k.start + k.size)
            if isinstance(k, (int, np.integer)):
                i = int(k) + n if k < 0 else int(k)
                if not 0 <= i < n:
                    _fail(OutOfBoundsError, f"index {k} out of range for dim {dim} of size {n}",
                          op="index")
                offset += i * s
                dropped.append(dim)
                shape.append(1)
                strides.append(s)
            elif isinstance(k, slice):
                count, stride, skip = _sliced(k, n, s, dim)
                offset += skip
                shape.append(count)
                strides.append(stride)
            else:
                _fail(TypeError, f"unsupported index {k!r} for dim {dim}", op="index")
        keep = _kept_dims(len(shape), dropped, self.on_chip)
        return self._derive([shape[d] for d in keep], [strides[d] for d in keep], offset)

    def _two_slices(self, k0, k1) -> "ndarray":
        (n0, n1), (s0, s1) = self._shape, self._strides
        c0, t0, o0 = _sliced(k0, n0, s0, 0)
        c1, t1, o1 = _sliced(k1, n1, s1, 1)
        return self._derive((c0, c1), (t0, t1), self._offset + o0 + o1)

    # -- view methods (NKI >= 0.5) ----------------------------------------------------------
    def slice(self, dim, start, end, step=1):
        key = [slice(None)] * self.ndim
        key[dim] = slice(start, end, step)
        return self[tuple(key)]

    def select(self, dim, index):
        key = [slice(None)] * self.ndim
        key[dim] = index
        return self[tuple(key)]

    def permute(self, dims):
        dims = tuple(dims)
        if sorted(dims) != list(range(self.ndim)):
            _fail(ValueError, f"permute dims {dims} are not a permutation of {self.ndim} dims",
                  op="permute")
        if self.on_chip and dims[0] != 0:
            _fail(ValidationError, f"permute dims {dims}: the partition dim must stay first",
                  op="permute")
        return self._derive([self._shape[d] for d in dims], [self._strides[d] for d in dims],
                            self._offset)

    def broadcast(self, dim, size):
        if self._shape[dim] != 1:
            _fail(ValueError, f"broadcast needs dim {dim} of size 1, it has {self._shape[dim]}",
                  op="broadcast")
        self._check_free_dim(dim, "broadcast")
        shape, strides = list(self._shape), list(self._strides)
        shape[dim], strides[dim] = int(size), 0
        return self._derive(shape, strides, self._offset)

    def expand_dim(self, dim):
        self._check_free_dim(dim, "expand_dim")
        shape, strides = list(self._shape), list(self._strides)
        shape.insert(dim, 1)
        strides.insert(dim, 0)
        return self._derive(shape, strides, self._offset)

    def squeeze_dim(self, dim):
        self._check_free_dim(dim, "squeeze_dim")
        if self._shape[dim] != 1:
            _fail(ValueError, f"squeeze_dim needs dim {dim} of size 1", op="squeeze_dim")
        keep = [d for d in range(self.ndim) if d != dim]
        return self._derive([self._shape[d] for d in keep], [self._strides[d] for d in keep],
                            self._offset)

    def reshape(self, shape):
        shape = tuple(int(n) for n in shape)
        if -1 in shape:
            known = math.prod([n for n in shape if n != -1])
            shape = tuple(self.size // known if n == -1 else n for n in shape)
        if math.prod(shape) != self.size:
            _fail(ValueError, f"cannot reshape {self._shape} to {shape}", op="reshape")
        if self.on_chip and shape[0] != self._shape[0]:
            _fail(ValidationError, f"reshape {self._shape} -> {shape} changes the partition dim",
                  op="reshape")
        if not self.is_contiguous():
            _fail(ValidationError, f"reshape needs a contiguous view, strides are {self._strides}",
                  op="reshape")
        return self._derive(shape, _contiguous_strides(shape), self._offset)

    def flatten_dims(self, start, end):
        shape = self._shape[:start] + (math.prod(self._shape[start:end + 1]),) + self._shape[end + 1:]
        return self.reshape(shape)

    def reshape_dim(self, dim, shape):
        return self.reshape(self._shape[:dim] + tuple(shape) + self._shape[dim + 1:])

    def view(self, dtype):
        """Reinterpret the bytes as ``dtype``; the last dim scales by the itemsize ratio."""
        dtype = dtypes.as_dtype(dtype)
        if not self.is_contiguous():
            _fail(ValidationError, "view(dtype) needs a contiguous tensor", op="view")
        last = aps.reinterpret_count(self._shape[-1], self._dtype, dtype, "last dim")
        shape = self._shape[:-1] + (last,)
        offset = aps.reinterpret_count(self._offset, self._dtype, dtype, "offset")
        return self._derive(shape, _contiguous_strides(shape), offset, dtype)

    reinterpret_cast = view

    def _check_free_dim(self, dim, op):
        if self.on_chip and dim == 0:
            _fail(ValidationError, f"{op} cannot touch the partition dim (dim 0)", op=op)

    # -- access patterns ------------------------------------------------------------------------
    def ap(self, pattern, offset=None, scalar_offset=None, vector_offset=None, indirect_dim=0,
           dtype=None) -> "ndarray":
        """A hardware access pattern over this tensor's storage; see the module docstring."""
        try:
            aps.check_not_nested(self._is_ap)
        except aps.AccessPatternError as err:
            _fail(AccessError, str(err))
        storage = self._storage
        dtype = self._dtype if dtype is None else dtypes.as_dtype(dtype)
        try:
            base_shape = storage.shape[:-1] + (
                aps.reinterpret_count(storage.shape[-1], storage.dtype, dtype, "last dim"),)
            start = (aps.reinterpret_count(self._offset, self._dtype, dtype, "offset")
                     if offset is None else int(offset))
            ap = aps.AccessPattern(pattern, start, dtype)
        except (aps.AccessPatternError, ValueError, TypeError) as err:
            _fail(AccessError, str(err))
        if scalar_offset is not None and vector_offset is not None:
            _fail(AccessError, "at most one of scalar_offset and vector_offset may be given")
        dynamic = None
        if scalar_offset is not None or vector_offset is not None:
            view_shape = self._shape[:-1] + (
                aps.reinterpret_count(self._shape[-1], self._dtype, dtype, "last dim"),)
            if not 0 <= indirect_dim < len(view_shape):
                _fail(AccessError, f"indirect_dim={indirect_dim} is not a dim of {view_shape}")
            row = math.prod(view_shape[indirect_dim + 1:])
            if vector_offset is not None:
                if indirect_dim != 0:
                    _fail(AccessError, f"vector_offset supports indirect_dim=0 only, "
                                       f"got {indirect_dim}")
                _check_offset_tensor(vector_offset, "vector_offset")
                if vector_offset.shape[0] != ap.pattern[0][1]:
                    _fail(AccessError, f"vector_offset has {vector_offset.shape[0]} partitions "
                                       f"but the pattern's first dim counts {ap.pattern[0][1]}")
                dynamic = DynamicOffset("vector", vector_offset, 0, row)
            else:
                if isinstance(scalar_offset, ndarray):
                    _check_offset_tensor(scalar_offset, "scalar_offset")
                    if scalar_offset.size != 1:
                        _fail(AccessError, f"scalar_offset must be a (1, 1) tensor, "
                                           f"got {scalar_offset.shape}")
                dynamic = DynamicOffset("scalar", scalar_offset, indirect_dim, row)
        if storage.buffer in ("sbuf", "psum"):
            try:
                aps.check_partition_rule(ap, base_shape, storage.buffer)
            except aps.AccessPatternError as err:
                _fail(AccessError, str(err))
        return ndarray.__new__(ndarray)._init_view(storage, ap.shape, ap.strides, ap.offset, dtype,
                                                   is_ap=True, dynamic=dynamic)


def _check_offset_tensor(t, what):
    if not isinstance(t, ndarray) or t._storage.buffer != "sbuf":
        _fail(AccessError, f"{what} must be an SBUF tensor, got {t!r}")
    if not dtypes.is_int(t.dtype):
        _fail(AccessError, f"{what} must hold integers, got {t.dtype.name}")


def _contiguous_strides(shape):
    strides, acc = [], 1
    for n in reversed(shape):
        strides.append(acc)
        acc *= int(n)
    return tuple(reversed(strides))


def _slice_bounds(k: slice, n: int, dim: int):
    step = 1 if k.step is None else int(k.step)
    if step < 1:
        _fail(ValidationError, f"slice step {step} on dim {dim}: only positive steps", op="index")
    start = 0 if k.start is None else int(k.start)
    stop = n if k.stop is None else int(k.stop)
    start, stop = (start + n if start < 0 else start), (stop + n if stop < 0 else stop)
    if not (0 <= start <= n and 0 <= stop <= n):
        _fail(OutOfBoundsError, f"slice {start}:{stop} out of range for dim {dim} of size {n}",
              op="index")
    return start, max(start, stop), step


def _sliced(k: slice, n: int, stride: int, dim: int):
    """(count, stride, offset in elements) of slice ``k`` over a dim of ``n`` at ``stride``."""
    start, stop, step = _slice_bounds(k, n, dim)
    return max(0, -(-(stop - start) // step)), stride * step, start * stride


def _kept_dims(ndim, dropped, on_chip):
    if not on_chip:
        return [d for d in range(ndim) if d not in dropped]
    keep = [d for d in range(ndim) if d == 0 or d not in dropped]
    if len(keep) < 2:
        keep = [0, ndim - 1] if ndim > 1 else [0]
    return keep


def _check_allocation(shape, dtype, buf, name, address):
    if not dtypes.is_nki_dtype(dtype):
        _fail(TypeError, f"dtype {dtype.name} is not an NKI dtype", op="nl.ndarray",
              operand=name or None)
    if any(n < 1 for n in shape):
        _fail(ValueError, f"shape {shape} has an empty dim", op="nl.ndarray", operand=name or None)
    if buf in ("sbuf", "psum"):
        target = context.current().target
        if len(shape) < 2:
            _fail(ValidationError, f"{buf} tensor shape {shape} needs a partition and a free dim",
                  op="nl.ndarray", operand=name or None)
        if shape[0] > target.pmax:
            _fail(ValidationError, f"partition dim {shape[0]} exceeds maximum {target.pmax}",
                  op="nl.ndarray", operand=name or None)
        if buf == "psum" and address is not None and address[1] % target.psum_bank_bytes:
            _fail(ValidationError, f"PSUM address {address} must start at a bank boundary "
                                   f"({target.psum_bank_bytes} B)", op="nl.ndarray",
                  operand=name or None)


_SHARED_LOCK = threading.Lock()


def _shared_hbm_storage(launch, shape, dtype, name):
    """Program instances of one launch share their k-th shared_hbm allocation."""
    with _SHARED_LOCK:
        return _shared_hbm_storage_locked(launch, shape, dtype, name)


def _shared_hbm_storage_locked(launch, shape, dtype, name):
    k = launch.shared_hbm_cursor
    launch.shared_hbm_cursor += 1
    if k < len(launch.shared_hbm):
        storage = launch.shared_hbm[k]
        if storage.shape != shape or storage.dtype != dtype:
            _fail(ValidationError, f"shared_hbm allocation #{k} differs between program "
                                   f"instances: {storage.shape} vs {shape}", op="nl.ndarray")
        return storage
    storage = Storage.allocate(shape, dtype, "shared_hbm", name)
    launch.shared_hbm.append(storage)
    return storage


def ds(start, size) -> DynSlice:
    """``nl.ds(start, size)``: the slice ``start:start+size``."""
    return DynSlice(int(start), int(size))
