"""Access patterns of the layouts the kernels use, built from shapes (element units).

Paged KV cache (FlashInfer): 5-D [N, 2, P, H, D] ("NHD") / [N, 2, H, P, D] ("HND"), or one of a
(k, v) pair of 4-D [N, P, H, D] / [N, H, P, D]: ``PagedKVLayout``. TensorScatter cache:
[B, D1, ..., M, ..., Dn] viewed as [outer, M, inner]: ``sequence_rows``, ``scatter_write``.
The kernels take their patterns from here; host-side builders return coalesced patterns, so
contiguous runs are as long as the layout allows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Tuple

import numpy as np

from .algebra import coalesce
from .pairs import sequence_rows_pairs
from .pattern import AccessPattern


@dataclass(frozen=True)
class PagedKVLayout:
    """Where a paged KV cache keeps each element: the one derivation of its strides and patterns,
    used by the host wrappers and, through the patterns, by the kernels.

    Cache forms: fused 5-D [N, 2, P, H, D] ("NHD") / [N, 2, H, P, D] ("HND"), K at [:, 0] and V
    at [:, 1]; or one of a (k, v) pair of 4-D [N, P, H, D] / [N, H, P, D]. Units: elements.
    """

    num_pages: int
    page_size: int
    num_heads: int
    head_dim: int
    layout: str
    fused: bool

    @classmethod
    def from_shape(cls, cache_shape, layout: str) -> "PagedKVLayout":
        if layout not in ("NHD", "HND"):
            raise ValueError(f"layout={layout!r} must be 'NHD' or 'HND'")
        shape = tuple(int(d) for d in cache_shape)
        if len(shape) == 5 and shape[1] == 2:
            n, inner, fused = shape[0], shape[2:], True
        elif len(shape) == 4:
            n, inner, fused = shape[0], shape[1:], False
        else:
            raise ValueError(f"cache shape {shape} must be [N, 2, P, H, D]-like (fused) or 4-D")
        P, H = (inner[0], inner[1]) if layout == "NHD" else (inner[1], inner[0])
        return cls(n, P, H, inner[2], layout, fused)

    @property
    def kv_block(self) -> int:
        """Elements of one page's K (or V): P * H * D."""
        return self.page_size * self.num_heads * self.head_dim

    @property
    def page_stride(self) -> int:
        return self.kv_block * (2 if self.fused else 1)

    @property
    def v_offset(self) -> int:
        """From a page's K block to its V block in a fused cache (0 for a pair)."""
        return self.kv_block if self.fused else 0

    @property
    def entry_stride(self) -> int:
        """Between consecutive tokens of a page."""
        return self.num_heads * self.head_dim if self.layout == "NHD" else self.head_dim

    @property
    def head_stride(self) -> int:
        return self.head_dim if self.layout == "NHD" else self.page_size * self.head_dim

    def start(self, page, entry, kv: int = 0, head: int = 0):
        """Flat element of (page, entry, head, d = 0) of K (kv 0) or V (kv 1); arrays allowed."""
        return (page * self.page_stride + kv * self.v_offset + entry * self.entry_stride
                + head * self.head_stride)

    def token(self) -> AccessPattern:
        """One token's [H, D] elements from its first: NHD one run of H*D; HND H runs of D. The
        innermost pair is always the unit-step run (``(1, 1)`` when D = 1 and H runs are apart)."""
        ap = coalesce(AccessPattern(((self.head_stride, self.num_heads), (1, self.head_dim))))
        if ap.pattern[-1][0] != 1:
            ap = AccessPattern(ap.pattern + ((1, 1),), ap.offset, ap.dtype)
        return ap

    @property
    def token_run(self) -> int:
        """Elements of a token's first contiguous run (H*D for NHD, D for HND): the row width of
        the row view the kernels address tokens in."""
        return self.token().pattern[-1][1]

    def tokens(self, count: int, token_step: int = None) -> AccessPattern:
        """``count`` tokens ``token_step`` apart (default: consecutive entries of one page), each
        as ``token()``; the token dimension stays outermost (the kernels' partition or indirect
        dimension), so it is not merged with the heads."""
        step = self.entry_stride if token_step is None else token_step
        return AccessPattern(((step, count),) + self.token().pattern)

    def page_rows(self, page: int, start: int, count: int, kv: int = 0,
                  head: int = None) -> AccessPattern:
        """Token rows ``start:start+count`` of one page (one kv head, or all heads when None).
        Shape before coalescing: NHD [count, H*D] ([count, D] for one head); HND [H, count, D]
        ([count, D])."""
        P, H, D = self.page_size, self.num_heads, self.head_dim
        if not (0 <= start and start + count <= P and count >= 1):
            raise ValueError(f"rows {start}:{start + count} are not inside a page of {P}")
        offset = self.start(page, start, kv, head or 0)
        if head is not None:
            pattern = ((self.entry_stride, count), (1, D))
        elif self.layout == "NHD":
            pattern = ((self.entry_stride, count), (1, H * D))
        else:
            pattern = ((self.head_stride, H), (self.entry_stride, count), (1, D))
        return coalesce(AccessPattern(pattern, offset))


def page_rows(layout: str, cache_shape, page: int, start: int, count: int, kv: int = 0,
              head: int = None) -> AccessPattern:
    """``PagedKVLayout.from_shape(cache_shape, layout).page_rows(...)``."""
    return PagedKVLayout.from_shape(cache_shape, layout).page_rows(page, start, count, kv, head)


def sequence_rows(outer: int, max_seq: int, rows: int, inner: int) -> AccessPattern:
    """Rows 0..rows-1 along the sequence axis of each of ``outer`` prefixes of a tensor viewed as
    [outer, max_seq, inner] (TensorScatter's cache and update): shape [outer, rows, inner],
    offset 0 (add the first row's and prefix's offset, statically or on device). ``rows`` may
    exceed ``max_seq`` when the row dimension is replaced by an indirect offset per row."""
    return AccessPattern(sequence_rows_pairs(outer, max_seq, rows, inner))


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
        dst = sequence_rows(outer, M, n, inner).with_offset((batch * outer * M + pos) * inner)
        src = sequence_rows(outer, seq_len, n, inner).with_offset(
            (batch * outer * seq_len + done) * inner)
        pieces.append((coalesce(dst), coalesce(src)))
        done += n
    return pieces
