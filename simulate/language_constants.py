"""``nl`` tensors with contents fixed at compile time or drawn at random: ``shared_constant``,
``shared_identity_matrix``, ``rand`` and ``random_seed``.

``shared_constant(array_or_npy_path)`` is a read-only shared-HBM tensor holding the data (embedded
in the binary on hardware; a write to it is refused here). ``shared_identity_matrix(n, dtype)``
is an [n, n] SBUF identity. ``rand`` draws uniform [0, 1) values from the launch's generator,
which ``random_seed`` reseeds from a [1, 1] tile (same seed, same values).
"""

from __future__ import annotations

import numpy as np

from . import context, dtypes
from .errors import ValidationError
from .tensor import MemoryRegion, ndarray

_CONSTANT_TYPES = ("float32", "float16", "bfloat16", "int32", "int16", "int8", "uint32", "uint16",
                   "uint8", "float8_e4m3fn", "float8_e5m2", "float8_e8m0fnu")


def shared_constant(constant):
    """A shared-HBM tensor holding ``constant`` (a NumPy array or the path of a ``.npy`` file)."""
    if isinstance(constant, str):
        constant = np.load(constant)
    array = np.array(constant, copy=True)
    if array.dtype == np.float64:
        array = array.astype(np.float32)
    elif array.dtype == np.int64:
        array = array.astype(np.int32)
    if array.dtype.name not in _CONSTANT_TYPES:
        context.fail(ValidationError, f"constant dtype {array.dtype.name} is not one of "
                     f"{', '.join(_CONSTANT_TYPES)}", op="shared_constant", operand="constant")
    array = np.ascontiguousarray(array)
    array.flags.writeable = False
    return ndarray._wrap(array, "shared_hbm", "shared_constant")


def shared_identity_matrix(n, dtype=dtypes.uint8, dst=None):
    """An [n, n] identity in SBUF (written into ``dst`` when given)."""
    from .isa import iota
    if dst is None:
        dst = ndarray((n, n), dtype, buffer=MemoryRegion.sbuf, name="identity")
    elif tuple(dst.shape) != (n, n):
        context.fail(ValidationError, f"dst {dst.shape} must be [{n}, {n}]",
                     op="shared_identity_matrix", operand="dst")
    # p == f  <=>  f - p == 0: an affine value per element, compared on GpSimd
    diff = ndarray((n, n), dtypes.int32, buffer=MemoryRegion.sbuf, name="identity_diff")
    iota(dst=diff, pattern=[[1, n]], offset=0, channel_multiplier=-1)
    from .access import resolve
    values = resolve(diff, "shared_identity_matrix", "dst").read() == 0
    resolve(dst, "shared_identity_matrix", "dst").write(values.astype(np.float32).astype(dst.dtype))
    return dst


def _generator():
    launch = context.current()
    gen = launch.__dict__.get("rng")
    if gen is None:
        gen = launch.__dict__["rng"] = np.random.default_rng(0)
    return gen


def random_seed(seed):
    """Reseed ``rand`` from a [1, 1] SBUF/PSUM tile holding a 32-bit seed."""
    from .access import resolve
    if seed.size != 1:
        context.fail(ValidationError, f"seed must be a [1, 1] tile, got {seed.shape}",
                     op="random_seed", operand="seed")
    value = int(resolve(seed, "random_seed", "seed").read().reshape(-1)[0])
    context.current().__dict__["rng"] = np.random.default_rng(value & 0xFFFFFFFF)


def rand(shape, dtype, buffer=MemoryRegion.sbuf, name=""):
    """A new tensor of uniform [0, 1) values."""
    from .access import resolve
    t = ndarray(shape, dtype, buffer=buffer, name=name)
    values = _generator().random(t.shape, dtype=np.float32)
    resolve(t, "rand", "dst").write(dtypes.cast(values, t.dtype))
    return t
