"""Our kernels' view of HF transformers' continuous-batching cache (``PagedAttentionCache``).

One cache allocator holds the layers of one attention type in one tensor ``cache_tensor``
[tokens, 2, H, D]; seen as rows of H*D elements, a block of L layers is 2*L pages of P rows:
layer i's K page, then its V page, for each of the L layers::

    rows of block b:  [ L0 K | L0 V | L1 K | L1 V | ... ]     (P rows each, b * 2LP onwards)

so from layer i's first row on, the rows group into pages of [2, P, H, D] = FlashInfer's fused NHD
page, and block b of layer i is fused page ``b * L``. HF addresses tokens by "physical rows"
(``read_index`` / ``write_index``) counted from layer i's first K row: row t is K of entry
``t % 2P`` of fused page ``t // 2P``; its V is row t + P.

Full-attention layers keep each request's tokens in order over whole pages (a CSR page table);
sliding-window layers keep a ring of at most W tokens (token at position p in slot p % W), so
their reads are token by token (``token_views``: pages of one token).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from nki_kernels.torch.convert import to_numpy


@dataclass(frozen=True)
class LayerCache:
    """One layer's cache as our kernels take it (NumPy views of HF's storage, no copy)."""

    fused: np.ndarray      # [N, 2, P, H, D] FlashInfer fused NHD pages from the layer's first row
    k_tokens: np.ndarray   # [R, 1, H, D] K of physical row r (pages of one token), read only
    v_tokens: np.ndarray   # [R, 1, H, D] V of physical row r, read only
    page_size: int         # P

    def slots(self, rows: np.ndarray) -> np.ndarray:
        """vLLM slot (page * P + entry) of the fused cache for each physical row (int64)."""
        page, entry = np.divmod(np.asarray(rows, np.int64), 2 * self.page_size)
        if (entry >= self.page_size).any():
            bad = int(np.asarray(rows)[entry >= self.page_size][0])
            raise ValueError(f"physical row {bad} is not a K row of this layer (entry "
                             f"{bad % (2 * self.page_size)} >= page size {self.page_size})")
        return page * self.page_size + entry


def layer_cache(allocator, layer_idx: int) -> LayerCache:
    """The views of layer ``layer_idx`` in ``allocator`` (a CacheAllocator of HF's
    ``PagedAttentionCache``), built from its public attributes."""
    table = allocator.cache_tensor                      # [tokens, 2, H, D]
    tokens, two, heads, dim = table.shape
    P = allocator.tokens_per_page
    i = allocator.layer_indices.index(layer_idx)
    rows = table.view(tokens * two, heads, dim)[2 * i * P:]
    n = rows.shape[0] // (2 * P)
    fused = to_numpy(rows[: n * 2 * P].view(n, 2, P, heads, dim))
    r = rows.shape[0] - P
    k_tok = to_numpy(rows[:r].view(r, 1, heads, dim))
    v_tok = to_numpy(rows[P:].view(r, 1, heads, dim))
    return LayerCache(fused, _read_only(k_tok), _read_only(v_tok), P)


def _read_only(a: np.ndarray) -> np.ndarray:
    view = a.view()
    view.flags.writeable = False
    return view


def page_table(rows: list[np.ndarray], page_size: int):
    """CSR page table of the fused cache for requests whose tokens, in order, sit at the physical
    rows ``rows[b]`` (a full-attention layer: whole pages, entry 0 first). Returns int32
    (kv_indptr [B+1], kv_indices, kv_last_page_len [B]); a layout that is not whole pages in
    order is refused (it would mean HF's layout differs from the one documented above)."""
    P = page_size
    pages, counts, last = [], [], []
    for b, r in enumerate(rows):
        r = np.asarray(r, np.int64)
        first = r[::P] // (2 * P)
        expect = np.repeat(first, P)[: r.size] * 2 * P + np.arange(r.size) % P
        if not np.array_equal(r, expect):
            raise ValueError(f"request {b}: its cache rows are not whole pages in order; "
                             f"not a full-attention layout")
        pages.append(first)
        counts.append(first.size)
        last.append(r.size - (first.size - 1) * P if r.size else 0)
    indptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    indices = np.concatenate(pages + [np.zeros(0, np.int64)]).astype(np.int32)
    return indptr, indices, np.asarray(last, np.int32)


def token_table(rows: list[np.ndarray]):
    """CSR table over pages of one token (``LayerCache.k_tokens``): request b reads rows[b]."""
    counts = [len(r) for r in rows]
    indptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    indices = np.concatenate([np.asarray(r, np.int64) for r in rows] + [np.zeros(0, np.int64)])
    return indptr, indices.astype(np.int32), (np.asarray(counts) > 0).astype(np.int32)


def host(t) -> np.ndarray:
    """A CPU index tensor (or a list) as int64 NumPy."""
    if isinstance(t, torch.Tensor):
        return t.detach().cpu().numpy().astype(np.int64)
    return np.asarray(t, np.int64)
