"""Access patterns of the layouts the kernels use, built from shapes (element units).

Paged KV cache (FlashInfer): 5-D [N, 2, P, H, D] ("NHD") / [N, 2, H, P, D] ("HND"), or one of a
(k, v) pair of 4-D [N, P, H, D] / [N, H, P, D]. TensorScatter cache: [B, D1, ..., M, ..., Dn].
Every builder returns coalesced patterns, so contiguous runs are as long as the layout allows.
"""

from __future__ import annotations

from typing import List, Tuple

import numpy as np

from .algebra import coalesce
from .pattern import AccessPattern


def page_rows(layout: str, cache_shape, page: int, start: int, count: int, kv: int = 0,
              head: int = None) -> AccessPattern:
    """Token rows ``start:start+count`` of one page (one kv head, or all heads when None).

    Shape of the result before coalescing: NHD [count, H*D] (or [count, D] for one head);
    HND [H, count, D] (or [count, D]).
    """
    fused = len(cache_shape) == 5
    if layout not in ("NHD", "HND"):
        raise ValueError(f"layout={layout!r} must be 'NHD' or 'HND'")
    inner = cache_shape[2:] if fused else cache_shape[1:]
    P, H, D = (inner[0], inner[1], inner[2]) if layout == "NHD" else (inner[1], inner[0], inner[2])
    if not (0 <= start and start + count <= P and count >= 1):
        raise ValueError(f"rows {start}:{start + count} are not inside a page of {P}")
    block = P * H * D
    base = (page * (2 if fused else 1) + (kv if fused else 0)) * block
    if layout == "NHD":
        offset = base + start * H * D + (head or 0) * D
        pattern = ((H * D, count), (1, D if head is not None else H * D))
    else:
        offset = base + start * D + (head or 0) * P * D
        pattern = ((D, count), (1, D)) if head is not None else ((P * D, H), (D, count), (1, D))
    return coalesce(AccessPattern(pattern, offset))


def ragged_rows(indptr, b: int, row_shape) -> AccessPattern:
    """Rows ``indptr[b]:indptr[b+1]`` of a ragged [T, *row_shape] tensor (one contiguous run)."""
    row = int(np.prod(row_shape))
    count = int(indptr[b + 1] - indptr[b])
    if count < 1:
        raise ValueError(f"request {b} has no rows")
    return AccessPattern(((1, count * row),), int(indptr[b]) * row)


def scatter_write(cache_shape, axis: int, batch: int, write_index: int, seq_len: int,
                  mode: str = "linear") -> List[Tuple[AccessPattern, AccessPattern]]:
    """(cache AP, update AP) pairs writing ``seq_len`` rows at ``write_index`` along ``axis`` for one
    batch entry: one pair, or two when a circular write wraps past max_seq."""
    M = cache_shape[axis]
    outer = int(np.prod(cache_shape[1:axis]))
    inner = int(np.prod(cache_shape[axis + 1:]))
    w = write_index % M if mode == "circular" else write_index
    if mode == "linear" and w + seq_len > M:
        raise ValueError(f"linear write {w} + {seq_len} exceeds max_seq {M}")
    pieces, done = [], 0
    while done < seq_len:
        pos = (w + done) % M
        n = min(seq_len - done, M - pos)
        dst = AccessPattern(((M * inner, outer), (inner, n), (1, inner)),
                            (batch * outer * M + pos) * inner)
        src = AccessPattern(((seq_len * inner, outer), (inner, n), (1, inner)),
                            (batch * outer * seq_len + done) * inner)
        pieces.append((coalesce(dst), coalesce(src)))
        done += n
    return pieces
