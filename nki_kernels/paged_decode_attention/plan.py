"""Host plan of a decode step: static layout constants and the per-request table the kernel reads.

The kernel is compiled once per shape bucket (see ``buckets.py``): nothing here that depends on
the requests' lengths becomes a compile-time constant. Lengths turn into a small int32 table on
the device (``request_table``), which the kernel reads to set its device-loop bounds.

A chunk is T tokens (T = (128 // P) * P for P <= 128; 128 for P a multiple of 128), so it spans
whole pages or part of one page. Request b owns tokens [W, L) (W: window start, 0 without a
window); its chunks are [c0, c1) = [W // T, ceil(L / T)). Chunks wholly inside [W, L), [full_lo,
full_hi), need no mask; at most one masked chunk precedes them and one follows.

Row addressing (cache viewed as rows of D elements): token entry e of page p, kv head h, is row
``p * rows_per_page + e * entry_stride + h * head_stride``; V rows are ``v_rows`` further in a fused
5-D cache.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# Columns of the request table: [B, META_COLS] int32.
PTR, LEN, WIN, C0, FULL_LO, FULL_HI, C1, SLOT0, ENTRY0, POS0 = range(10)
META_COLS = 10


@dataclass(frozen=True)
class DecodeLayout:
    """What the kernel fixes at compile time: chunk size and row strides (cache shape only)."""

    chunk: int                  # T tokens per chunk
    rows_per_page: int
    entry_stride: int
    head_stride: int
    v_rows: int                 # fused cache: V rows after K; pair: 0

    @property
    def strides(self):
        return (self.rows_per_page, self.entry_stride, self.head_stride, self.v_rows)

    def token_table(self, page_size: int) -> np.ndarray:
        """[T, 2] int32: page slot and entry of chunk-local token t, relative to the chunk's first
        token (a chunk starts on a page boundary when P <= 128, inside one page otherwise)."""
        t = np.arange(self.chunk)
        if page_size <= 128:
            return np.stack([t // page_size, t % page_size], axis=1).astype(np.int32)
        return np.stack([np.zeros_like(t), t], axis=1).astype(np.int32)


def chunk_tokens(page_size: int) -> int:
    if page_size <= 128:
        return (128 // page_size) * page_size
    if page_size % 128:
        raise ValueError(f"page_size={page_size}: the decode kernel takes page sizes <= 128 or "
                         f"multiples of 128")
    return 128


def make_layout(geo) -> DecodeLayout:
    P, H = geo.page_size, geo.num_heads
    per_kv = P * H
    entry_stride, head_stride = (H, 1) if geo.layout == "NHD" else (1, P)
    return DecodeLayout(chunk_tokens(P), per_kv * (2 if geo.fused else 1), entry_stride,
                        head_stride, per_kv if geo.fused else 0)


def request_table(kv_indptr, kv_lens, window_left: int, page_size: int, rows: int) -> np.ndarray:
    """[rows, META_COLS] int32 device table; rows past the batch are empty requests (L = 0).

    Per request: kv_indices start (PTR), length L, window start W, chunk bounds c0 <= full_lo <=
    full_hi <= c1, and where chunk c0 starts: its kv_indices slot (SLOT0 = PTR + c0*T // P), page
    entry (ENTRY0) and token position (POS0 = c0 * T).
    """
    T = chunk_tokens(page_size)
    L = np.asarray(kv_lens, np.int64)
    W = np.maximum(0, L - 1 - window_left) if window_left >= 0 else np.zeros_like(L)
    W = np.where(L > 0, W, 0)
    c0, c1 = W // T, -(-L // T)
    full_lo = np.minimum(-(-W // T), c1)
    full_hi = np.maximum(full_lo, L // T)
    pos0 = c0 * T
    table = np.zeros((rows, META_COLS), np.int64)
    n = L.size
    table[:n, PTR] = np.asarray(kv_indptr, np.int64)[:n]
    table[:n, LEN], table[:n, WIN], table[:n, C0], table[:n, C1] = L, W, c0, c1
    table[:n, FULL_LO], table[:n, FULL_HI] = full_lo, full_hi
    table[:n, SLOT0] = table[:n, PTR] + pos0 // page_size
    table[:n, ENTRY0], table[:n, POS0] = pos0 % page_size, pos0
    return table.astype(np.int32)
