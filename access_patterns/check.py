"""Rules an access pattern must obey, each raising ``AccessPatternError`` with the rule in words.

The rules come from the NKI Beta 2 documentation of ``nl.ndarray.ap``:
- SBUF/PSUM: the first pair addresses partitions and must be contiguous: its step equals the
  tensor's whole free size (in elements of the access dtype) and its num is at most 128.
- Every element visited lies inside the tensor.
- ``.ap`` cannot be applied to a tensor that is already an access pattern.
- With ``dtype=``, steps and offset count elements of the new dtype: a free size of ``F`` elements
  of ``itemsize`` bytes is ``F * itemsize / new_itemsize`` new elements, which must be whole.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from .pattern import AccessPattern

PARTITION_MAX = 128
ON_CHIP_BUFFERS = ("sbuf", "psum")


class AccessPatternError(ValueError):
    """An access pattern breaks a hardware or API rule."""


def reinterpret_count(count: int, from_dtype, to_dtype, what: str = "element count") -> int:
    """``count`` elements of ``from_dtype`` expressed in elements of ``to_dtype``.

    Example: 256 int32 elements are 512 bfloat16 elements.
    """
    from_size, to_size = np.dtype(from_dtype).itemsize, np.dtype(to_dtype).itemsize
    nbytes = count * from_size
    if nbytes % to_size:
        raise AccessPatternError(
            f"{what}={count} of {np.dtype(from_dtype).name} is {nbytes} bytes, "
            f"not a whole number of {np.dtype(to_dtype).name} elements ({to_size} bytes)"
        )
    return nbytes // to_size


def free_size(shape: Sequence[int]) -> int:
    """Elements per partition of an on-chip tensor of ``shape`` (partition dimension first)."""
    return math.prod(shape[1:])


def check_partition_rule(ap: AccessPattern, tensor_shape: Sequence[int], buffer: str,
                         partition_max: int = PARTITION_MAX) -> None:
    """SBUF/PSUM only: the first pair must be ``[free_size, P]`` with ``P <= partition_max``.

    ``tensor_shape`` is counted in elements of the access dtype (see ``reinterpret_count``).
    """
    if buffer not in ON_CHIP_BUFFERS:
        return
    step, num = ap.pattern[0]
    free = free_size(tensor_shape)
    if len(tensor_shape) < 2:
        raise AccessPatternError(f"{buffer} tensor of shape {tuple(tensor_shape)} has no free dimension")
    if step != free:
        raise AccessPatternError(
            f"partition step {step} must equal the tensor's free size {free} "
            f"(shape {tuple(tensor_shape)}): {buffer} partitions are read contiguously"
        )
    if num > partition_max:
        raise AccessPatternError(f"partition count {num} exceeds the maximum of {partition_max}")
    inner = AccessPattern(ap.pattern[1:] or ((0, 1),), ap.offset % free)
    lo, hi = inner.extent
    if lo < 0 or hi >= free:
        raise AccessPatternError(
            f"free-dimension access {ap} reaches element {hi if hi >= free else lo} of a "
            f"partition of free size {free}: each partition is addressed on its own"
        )


def check_bounds(ap: AccessPattern, num_elements: int) -> None:
    """Every flat index visited must lie in ``[0, num_elements)``."""
    lo, hi = ap.extent
    if lo < 0:
        raise AccessPatternError(f"pattern {ap} reaches flat index {lo}, before the tensor's start")
    if hi >= num_elements:
        raise AccessPatternError(
            f"pattern {ap} reaches flat index {hi}, tensor has {num_elements} elements"
        )


def check_not_nested(is_access_pattern: bool) -> None:
    """``.ap`` is allowed on an ``nl.ndarray`` only, not on a tile that ``.ap`` produced."""
    if is_access_pattern:
        raise AccessPatternError("cannot specify an access pattern on an already indexed tensor")
