"""``nki.language``: buffers, dtypes, tensor creation, program ids, loops, tile sizes, op tokens."""

from __future__ import annotations

import builtins

import numpy as np

from . import context as _context
from . import dtypes as _dtypes
from .language_constants import rand, random_seed, shared_constant, shared_identity_matrix
from .objects import NKIObject
from .ops import ALL_OPS as _ALL_OPS
from .registers import dynamic_range, fori_loop, while_loop
from .tensor import MemoryRegion, ds, ndarray

# dtypes are names, as in the real package (``simulate.dtypes.DType``): nl.float32 == "float32"
globals().update({_n: _dtypes.nki_name(_d) for _n, _d in _dtypes.NKI_DTYPES.items()})
tfloat32 = _dtypes.DType("tfloat32")                  # stored as float32
NkiTensor = tensor = ndarray
bool = bool_               # noqa: A001, F821 - NKI's name
dtype = DType = _dtypes.DType   # the type of nl.float32 & co. (annotations, isinstance checks)
range = builtins.range     # noqa: A001 - unrolled at trace time, like every Python loop
sbuf, psum = MemoryRegion.sbuf, MemoryRegion.psum
private_hbm, shared_hbm = MemoryRegion.private_hbm, MemoryRegion.shared_hbm
hbm = private_hbm

globals().update(_ALL_OPS)


def is_hbm(buffer) -> bool:
    return buffer in (private_hbm, shared_hbm)


def is_sbuf(buffer) -> bool:
    return buffer == sbuf


def is_psum(buffer) -> bool:
    return buffer == psum


def is_on_chip(buffer) -> bool:
    return buffer in (sbuf, psum)


# -- creation --------------------------------------------------------------------------------
def _filled(shape, value, dtype, buffer, name):
    from .isa import memset
    t = ndarray(shape, dtype, buffer=buffer, name=name)
    if buffer in (sbuf, psum):
        memset(t, value)
    else:
        t._storage.data[...] = np.asarray(value).astype(t.dtype)
    return t


def zeros(shape, dtype, buffer=sbuf, name=""):
    return _filled(shape, 0, dtype, buffer, name)


def ones(shape, dtype, buffer=sbuf, name=""):
    return _filled(shape, 1, dtype, buffer, name)


def full(shape, fill_value, dtype, buffer=sbuf, name=""):
    return _filled(shape, fill_value, dtype, buffer, name)


def zeros_like(x, dtype=None, buffer=None, name=""):
    return zeros(x.shape, dtype or x.dtype, buffer or x.buffer, name)


def empty_like(x, dtype=None, buffer=None, name=""):
    return ndarray(x.shape, dtype or x.dtype, buffer=buffer or x.buffer, name=name)


# -- programs and loops ------------------------------------------------------------------------
def program_id(axis=0) -> int:
    launch = _context.current()
    pid = launch.program_id
    if not 0 <= axis < builtins.max(1, len(launch.grid)):
        raise ValueError(f"program_id(axis={axis}) outside a {len(launch.grid)}-D launch grid")
    return pid[axis] if axis < len(pid) else 0


def num_programs(axes=0):
    grid = _context.current().grid or (1,)
    if isinstance(axes, (tuple, list)):
        return tuple(grid[a] for a in axes)
    return grid[axes]


def program_ndim() -> int:
    return len(_context.current().grid)


def affine_range(start, stop=None, step=1):
    """Deprecated alias of ``range`` (fully unrolled at trace time)."""
    return range(start, stop, step) if stop is not None else range(start)


sequential_range = static_range = affine_range


def par_dim(size):
    """Beta 1 partition-dimension marker; in Beta 2 dim 0 of an on-chip tensor is the partition
    dimension, so ``nl.par_dim(n)`` is just ``n``."""
    return int(size)


def arange(start, stop=None, step=1):
    """Beta 1 index helper, kept for host-side index arithmetic: an int32 vector. Beta 2 removed
    affine index expressions; index tensors with slices, ``nl.ds`` or ``.ap``."""
    return np.arange(start, stop, step, dtype=np.int32) if stop is not None else \
        np.arange(start, dtype=np.int32)


class _TileSize:
    """``nl.tile_size``: limits of the selected target."""

    pmax = property(lambda self: _context.current().target.pmax)
    psum_fmax = property(lambda self: _context.current().target.psum_fmax)
    psum_bank_fmax = psum_fmax
    gemm_stationary_fmax = property(lambda self: _context.current().target.gemm_stationary_fmax)
    gemm_moving_fmax = property(lambda self: _context.current().target.gemm_moving_fmax)
    bn_stats_fmax = 512
    psum_num_banks = property(lambda self: _context.current().target.psum_num_banks)
    total_available_sbuf_size = property(lambda self: _context.current().target.sbuf_usable_bytes)
    psum_bank_fmax_bytes = psum_fmax_bytes = property(
        lambda self: _context.current().target.psum_bank_bytes)
    sbuf_size_bytes = property(lambda self: _context.current().target.pmax
                               * _context.current().target.sbuf_partition_bytes)
    sbuf_fmax_bytes = property(lambda self: _context.current().target.sbuf_usable_bytes)
    sbuf_fmax = property(lambda self: _context.current().target.sbuf_usable_bytes // 4)


tile_size = _TileSize()


def device_print(print_prefix, tensor):
    """Print a tile's current values (at run time, here as in NKI's simulator)."""
    from .access import resolve
    print(print_prefix, resolve(tensor, "device_print", "tensor").read())


class no_reorder:
    """``with nl.no_reorder():`` keeps program order; execution here is in program order anyway."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

try:  # nl convenience ops (load/store/matmul/exp ...) live in their own module
    from .language_ops import *  # noqa: F401,F403
except ImportError as _err:  # pragma: no cover - only while that module is being written
    if "language_ops" not in str(_err):
        raise
