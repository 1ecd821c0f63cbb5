"""The NKI access pattern as an immutable value: ``offset + sum(i_k * step_k)``.

An access pattern (AP) describes a loop nest over a tensor flattened to 1-D. ``pattern`` lists
``(step, num)`` pairs, outermost first; element ``(i_0, ..., i_{n-1})`` of the access is the flat
element ``offset + sum(i_k * step_k)``. The shape of the access is the tuple of ``num``. Steps and
offsets count elements of ``dtype`` (the tensor's own dtype when ``dtype`` is None).

This mirrors ``nl.ndarray.ap(pattern, offset, ..., dtype)`` of NKI Beta 2, where the hardware lists
the same pairs in the reverse order.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Optional, Sequence, Tuple

import numpy as np

Pair = Tuple[int, int]


def _as_pairs(pattern: Iterable[Sequence[int]]) -> Tuple[Pair, ...]:
    pairs = []
    for k, pair in enumerate(pattern):
        pair = tuple(pair)
        if len(pair) != 2:
            raise ValueError(f"pattern[{k}]={pair!r} must be a [step, num] pair")
        step, num = pair
        if not isinstance(step, (int, np.integer)) or not isinstance(num, (int, np.integer)):
            raise TypeError(f"pattern[{k}]={pair!r}: step and num must be integers")
        if num < 1:
            raise ValueError(f"pattern[{k}]={pair!r}: num must be >= 1")
        pairs.append((int(step), int(num)))
    if not pairs:
        raise ValueError("pattern must have at least one [step, num] pair")
    return tuple(pairs)


def extent(pairs, offset: int = 0) -> Tuple[int, int]:
    """``(lo, hi)``: smallest and largest flat index ``offset + sum(i * step)`` reaches over the
    ``(step, num)`` pairs (inclusive); for views, ``zip(strides, shape)``."""
    lo = hi = offset
    for step, num in pairs:
        reach = step * (num - 1)
        if reach < 0:
            lo += reach
        else:
            hi += reach
    return lo, hi


@dataclass(frozen=True)
class AccessPattern:
    """``offset + (num:step, ...)`` over a flattened tensor.

    Attributes:
        pattern: ``((step, num), ...)``, outermost dimension first.
        offset: flat element index of element ``(0, ..., 0)``.
        dtype: element type the steps and offset count in (None: the tensor's own).
    """

    pattern: Tuple[Pair, ...]
    offset: int = 0
    dtype: Optional[np.dtype] = None

    def __post_init__(self):
        object.__setattr__(self, "pattern", _as_pairs(self.pattern))
        if not isinstance(self.offset, (int, np.integer)):
            raise TypeError(f"offset={self.offset!r} must be an integer")
        object.__setattr__(self, "offset", int(self.offset))
        if self.dtype is not None:
            object.__setattr__(self, "dtype", np.dtype(self.dtype))

    @classmethod
    def from_strides(cls, shape, strides, offset=0, dtype=None) -> "AccessPattern":
        """The AP of a strided view (NumPy-style shape and element strides)."""
        if len(shape) != len(strides):
            raise ValueError(f"shape={tuple(shape)} and strides={tuple(strides)} differ in rank")
        if (dtype is None and shape and type(offset) is int and min(shape) >= 1
                and all(type(v) is int for v in shape) and all(type(v) is int for v in strides)):
            ap = object.__new__(cls)                  # already valid: skip the generic checks
            object.__setattr__(ap, "pattern", tuple(zip(strides, shape)))
            object.__setattr__(ap, "offset", offset)
            object.__setattr__(ap, "dtype", None)
            return ap
        return cls(tuple(zip(strides, shape)), offset, dtype)

    @property
    def shape(self) -> Tuple[int, ...]:
        return tuple(num for _, num in self.pattern)

    @property
    def strides(self) -> Tuple[int, ...]:
        return tuple(step for step, _ in self.pattern)

    @property
    def ndim(self) -> int:
        return len(self.pattern)

    @property
    def size(self) -> int:
        """Number of elements visited (with repeats when a step is 0)."""
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def extent(self) -> Tuple[int, int]:
        """``(lo, hi)``: the smallest and largest flat index visited (inclusive)."""
        return extent(self.pattern, self.offset)

    def __call__(self, *idx: int) -> int:
        """Flat index of element ``idx`` of the access."""
        if len(idx) != self.ndim:
            raise IndexError(f"{self} takes {self.ndim} indices, got {len(idx)}")
        flat = self.offset
        for k, (i, (step, num)) in enumerate(zip(idx, self.pattern)):
            if not 0 <= i < num:
                raise IndexError(f"index {i} out of range for dimension {k} of size {num}")
            flat += i * step
        return flat

    def indices(self) -> np.ndarray:
        """All flat indices, as an int64 array of ``shape`` (vectorised, no Python loop per element)."""
        flat = np.full((1,) * self.ndim, self.offset, dtype=np.int64)
        for k, (step, num) in enumerate(self.pattern):
            shape = [1] * self.ndim
            shape[k] = num
            flat = flat + (np.arange(num, dtype=np.int64) * step).reshape(shape)
        return np.broadcast_to(flat, self.shape)

    def to_list(self):
        """The pattern as NKI spells it: ``[[step, num], ...]``."""
        return [[step, num] for step, num in self.pattern]

    def with_offset(self, offset: int) -> "AccessPattern":
        return AccessPattern(self.pattern, offset, self.dtype)

    def __str__(self) -> str:
        dims = ", ".join(f"{num}:{step}" for step, num in self.pattern)
        suffix = f" as {self.dtype.name}" if self.dtype is not None else ""
        return f"{self.offset} + ({dims}){suffix}"
