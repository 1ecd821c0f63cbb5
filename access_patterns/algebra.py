"""Algebra on access patterns. Every function states what it guarantees as ``@post`` lines.

Notation: ``ap(i)`` is the flat index of the i-th element in row-major visit order,
``ap.indices().reshape(-1)[i]``.
"""

from __future__ import annotations

from .pairs import permute_pairs, tile_pairs
from .pattern import AccessPattern


def coalesce(ap: AccessPattern) -> AccessPattern:
    """Merge adjacent dimensions that form one arithmetic run; drop dimensions of num 1.

    @post coalesce(ap).size == ap.size
    @post coalesce(ap).indices().reshape(-1) == ap.indices().reshape(-1)   (same order)
    @post no adjacent pair (s0, n0), (s1, n1) of the result has s0 == s1 * n1
    """
    merged = []
    for step, num in ap.pattern:
        if num == 1:
            continue
        if merged and merged[-1][0] == step * num:
            merged[-1] = (step, merged[-1][1] * num)
        else:
            merged.append((step, num))
    return AccessPattern(tuple(merged) or ((1, 1),), ap.offset, ap.dtype)


def contiguous_run(ap: AccessPattern) -> int:
    """Elements in the innermost unit-stride run of ``coalesce(ap)`` (1 if the innermost step != 1).

    @post ap.size % contiguous_run(ap) == 0
    """
    step, num = coalesce(ap).pattern[-1]
    return num if step == 1 else 1


def split(ap: AccessPattern, dim: int, inner: int) -> AccessPattern:
    """Split dimension ``dim`` (num = outer * inner) into (outer, inner).

    @post split(ap, d, k).shape == ap.shape[:d] + (ap.shape[d] // k, k) + ap.shape[d+1:]
    @post split(ap, d, k).indices() == ap.indices().reshape(split(ap, d, k).shape)
    """
    step, num = ap.pattern[dim]
    if inner < 1 or num % inner:
        raise ValueError(f"cannot split dimension {dim} of size {num} into pieces of {inner}")
    pairs = ap.pattern[:dim] + ((step * inner, num // inner), (step, inner)) + ap.pattern[dim + 1:]
    return AccessPattern(pairs, ap.offset, ap.dtype)


def tile(ap: AccessPattern, dim: int, size: int):
    """Cut dimension ``dim`` into tiles of ``size`` (the last one may be shorter).

    @post concatenating [t.indices() for t in tile(ap, d, s)] along d gives ap.indices()
    @post every tile has shape[d] <= s
    """
    if size < 1:
        raise ValueError(f"tile size {size} must be >= 1")
    return [AccessPattern(pairs, ap.offset + offset, ap.dtype)
            for pairs, offset in tile_pairs(ap.pattern, dim, size)]


def compose(ap: AccessPattern, key) -> AccessPattern:
    """The AP of ``view[key]`` for a basic NumPy index (ints and slices with positive steps).

    @post compose(ap, key).indices() == ap.indices()[key]   (when the result keeps >= 1 dim)
    """
    key = key if isinstance(key, tuple) else (key,)
    key = key + (slice(None),) * (ap.ndim - len(key))
    pairs, offset = [], ap.offset
    for (step, num), k in zip(ap.pattern, key):
        if isinstance(k, slice):
            start, stop, stride = k.indices(num)
            if stride < 1:
                raise ValueError(f"slice {k} needs a positive step")
            count = max(0, -(-(stop - start) // stride))
            if count == 0:
                raise ValueError(f"slice {k} of a dimension of size {num} is empty")
            offset += start * step
            pairs.append((step * stride, count))
        else:
            i = k + num if k < 0 else k
            if not 0 <= i < num:
                raise IndexError(f"index {k} out of range for size {num}")
            offset += i * step
    return AccessPattern(tuple(pairs) or ((1, 1),), offset, ap.dtype)


def permute(ap: AccessPattern, dims) -> AccessPattern:
    """Reorder dimensions. @post permute(ap, p).indices() == ap.indices().transpose(p)"""
    if sorted(dims) != list(range(ap.ndim)):
        raise ValueError(f"{tuple(dims)} is not a permutation of {ap.ndim} dimensions")
    return AccessPattern(permute_pairs(ap.pattern, dims), ap.offset, ap.dtype)


def reinterpret(ap: AccessPattern, from_dtype, to_dtype) -> AccessPattern:
    """The same bytes seen as ``to_dtype`` elements: offset and steps scale by the size ratio and
    the innermost (unit-step) dimension's num scales too.

    @post reinterpret(ap, a, b) covers exactly the bytes ap covers (as whole elements of b)
    """
    import numpy as np
    src, dst = np.dtype(from_dtype).itemsize, np.dtype(to_dtype).itemsize
    *outer, (step, num) = coalesce(ap).pattern
    if step != 1 and src != dst:
        raise ValueError(f"{ap}: the innermost dimension must be unit-step to change element size")

    def scale(x, what):
        if (x * src) % dst:
            raise ValueError(f"{what}={x} {np.dtype(from_dtype).name} elements is not a whole number "
                             f"of {np.dtype(to_dtype).name} elements")
        return x * src // dst
    pairs = tuple((scale(s, "step"), n) for s, n in outer) + ((step, scale(num, "innermost num")),)
    return AccessPattern(pairs, scale(ap.offset, "offset"), to_dtype)
