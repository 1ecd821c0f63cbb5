"""The access-pattern builders on plain ``[[step, num], ...]`` lists, the form ``.ap`` takes:
written in the NKI Python subset (plain loops, no comprehensions, tuple targets or ``raise``),
so kernel code calls them directly; the ``AccessPattern`` value type's builders
(``layouts.sequence_rows``, ``algebra.permute`` / ``tile``) are these, wrapped.
"""

from __future__ import annotations


def sequence_rows_pairs(outer, max_seq, rows, inner):
    """``rows`` rows along the sequence axis of each of ``outer`` prefixes of a tensor viewed as
    [outer, max_seq, inner], from row 0: shape [outer, rows, inner]."""
    return [[max_seq * inner, outer], [inner, rows], [1, inner]]


def permute_pairs(pairs, dims):
    """The dimensions of ``pairs`` in the order ``dims`` (a permutation of their indices)."""
    assert len(dims) == len(pairs), f"{dims} does not permute {len(pairs)} dimensions"
    out = []
    for d in dims:
        out.append([pairs[d][0], pairs[d][1]])
    return out


def tile_pairs(pairs, dim, size):
    """Dimension ``dim`` cut into tiles of ``size`` (the last may be shorter): a list of
    [tile pairs, offset of the tile from the pattern's start]."""
    assert size >= 1, f"tile size {size} must be >= 1"
    step = pairs[dim][0]
    num = pairs[dim][1]
    tiles = []
    for start in range(0, num, size):
        piece = []
        for k in range(len(pairs)):
            piece.append([step, min(size, num - start)] if k == dim
                         else [pairs[k][0], pairs[k][1]])
        tiles.append([piece, start * step])
    return tiles
