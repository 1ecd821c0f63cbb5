"""Algebra on access patterns. Every function states what it guarantees as ``@post`` lines.

Notation: ``ap(i)`` is the flat index of the i-th element in row-major visit order,
``ap.indices().reshape(-1)[i]``.
"""

from __future__ import annotations

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
