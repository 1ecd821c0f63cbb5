"""Host plan of a decode step: what the kernel fixes at trace time.

Chunks wholly inside a request's [window start, length) need no masking; the plan marks them.

Like FlashInfer's ``plan()``, which copies the page-table lengths to the host, the plan turns KV
lengths into per-request chunk ranges (compile-time constants); page ids, lengths and the K/V data
stay runtime data read on device. A chunk is T tokens (T = (128 // P) * P for P <= 128; 128 for P a
multiple of 128), so it spans whole pages or part of one page.

Row addressing (cache viewed as rows of D elements): token entry e of page p, kv head h, is row
``p * rows_per_page + e * entry_stride + h * head_stride``; V rows are ``v_rows`` further in a fused
5-D cache.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Tuple

import numpy as np


@dataclass(frozen=True)
class DecodePlan:
    chunk: int                                  # T tokens per chunk
    chunks: Tuple[Tuple[int, int, int, int], ...]   # per request: (first, end, first full, end full)
    rows_per_page: int
    entry_stride: int
    head_stride: int
    v_rows: int                                 # fused cache: V rows after K; pair: 0

    def token_table(self, page_size: int) -> np.ndarray:
        """[T, 2] int32: page slot and entry of chunk-local token t (plus per-chunk offsets)."""
        t = np.arange(self.chunk)
        if page_size <= 128:
            return np.stack([t // page_size, t % page_size], axis=1).astype(np.int32)
        return np.stack([np.zeros_like(t), t], axis=1).astype(np.int32)

    def chunk_origin(self, c: int, page_size: int) -> Tuple[int, int]:
        """(page slot, entry) where chunk c starts."""
        return divmod(c * self.chunk, page_size)


def chunk_tokens(page_size: int) -> int:
    if page_size <= 128:
        return (128 // page_size) * page_size
    if page_size % 128:
        raise ValueError(f"page_size={page_size}: the decode kernel takes page sizes <= 128 or "
                         f"multiples of 128")
    return 128


def make_plan(geo, kv_lens, window_left: int) -> DecodePlan:
    T = chunk_tokens(geo.page_size)
    chunks = []
    for L in kv_lens.tolist():
        start = max(0, L - 1 - window_left) if window_left >= 0 else 0
        full_lo, full_hi = -(-start // T), L // T          # chunks with every token in [start, L)
        chunks.append((start // T, -(-L // T), full_lo, max(full_lo, full_hi)) if L else (0, 0, 0, 0))
    P, H = geo.page_size, geo.num_heads
    per_kv = P * H
    if geo.layout == "NHD":
        entry_stride, head_stride = H, 1
    else:
        entry_stride, head_stride = 1, P
    return DecodePlan(T, tuple(chunks), per_kv * (2 if geo.fused else 1), entry_stride,
                      head_stride, per_kv if geo.fused else 0)
