"""Host plan of a decode step: static layout constants and the per-request table the kernel reads.

The kernel is compiled once per shape bucket (see ``buckets.py``): nothing here that depends on
the requests' lengths becomes a compile-time constant. Lengths turn into a small int32 table on
the device (``request_table``), which the kernel reads to set its device-loop bounds.

A chunk is T tokens (T = (128 // P) * P for P <= 128; 128 for P a multiple of 128), so it spans
whole pages or part of one page. Request b owns tokens [W, L) (W: window start, 0 without a
window); its chunks are [c0, c1) = [W // T, ceil(L / T)). Chunks wholly inside [W, L), [full_lo,
full_hi), need no mask; at most one masked chunk precedes them and one follows.

Row addressing (cache viewed as rows of D elements; strides from ``access_patterns.PagedKVLayout``):
token entry e of page p starts at row ``p * rows_per_page + e * entry_stride``; V rows are
``v_rows`` further in a fused 5-D cache. The kernel reads a token's heads with the layout's token
pattern.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

# Columns of the work-item table: [items, META_COLS] int32. An item is a request, or a block of
# a request's query tokens (query rows [OUT, OUT + q_block) of the padded q), or the part of
# either that one core takes. Keys of query row qi of the block: [W_r, L_r) with
# L_r = min(HI_BASE + qi, LEN) and W_r = max(0, Q_BASE + qi - W_SPAN); LEN / WIN are the largest
# L_r / smallest W_r of the block's real rows (what the item gathers).
PTR, LEN, WIN, C0, FULL_LO, FULL_HI, C1, SLOT0, ENTRY0, POS0, OUT, HI_BASE, Q_BASE, W_SPAN = \
    range(14)
META_COLS = 14
NO_WINDOW = 1 << 24          # W_SPAN without a sliding window: every W_r clamps to 0


@dataclass(frozen=True)
class DecodeLayout:
    """What the kernel fixes at compile time: chunk size and row strides (cache shape only)."""

    chunk: int                  # T tokens per chunk
    rows_per_page: int
    entry_stride: int           # the heads of a token: the layout's token pattern
    v_rows: int                 # fused cache: V rows after K; pair: 0

    @property
    def strides(self):
        return (self.rows_per_page, self.entry_stride, self.v_rows)

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
    """Row strides (rows of D elements) from the cache's ``access_patterns.PagedKVLayout``."""
    D = geo.head_dim
    return DecodeLayout(chunk_tokens(geo.page_size), geo.page_stride // D, geo.entry_stride // D,
                        geo.v_offset // D)


class _Requests(NamedTuple):
    """Work items (requests, or query blocks of requests), one array entry each."""

    ptr: np.ndarray        # kv_indices start
    L: np.ndarray          # keys end (largest over the item's query rows)
    W: np.ndarray          # window start (smallest over the item's query rows)
    c0: np.ndarray         # chunks [c0, c1) hold the keys [W, L)
    c1: np.ndarray
    full_lo: np.ndarray    # chunks [full_lo, full_hi) are inside every query row's keys
    full_hi: np.ndarray
    out: np.ndarray        # first row of the item's queries in the padded q / out
    request: np.ndarray    # the request the item belongs to
    q0: np.ndarray         # its first query, counted within the request
    hi_base: np.ndarray    # query row qi's keys end min(hi_base + qi, L) (causal) or L
    q_base: np.ndarray     # query row qi's position + 1 (for its window start)
    w_span: int            # window_left + 1, or NO_WINDOW

    def items(self, idx, a, e, page_size):
        """[n, META_COLS] int64 rows of work items: requests ``idx`` over chunks [a, e) (a
        part of [c0, c1); the mask-free range is clipped to it)."""
        T = chunk_tokens(page_size)
        full_lo = np.clip(self.full_lo[idx], a, e)
        full_hi = np.clip(self.full_hi[idx], full_lo, e)
        pos0 = np.asarray(a, np.int64) * T
        ptr = self.ptr[idx]
        rows = np.zeros((np.size(ptr), META_COLS), np.int64)
        rows[:, PTR], rows[:, LEN], rows[:, WIN] = ptr, self.L[idx], self.W[idx]
        rows[:, OUT], rows[:, HI_BASE], rows[:, Q_BASE] = (self.out[idx], self.hi_base[idx],
                                                           self.q_base[idx])
        rows[:, W_SPAN] = self.w_span
        rows[:, C0], rows[:, FULL_LO], rows[:, FULL_HI], rows[:, C1] = a, full_lo, full_hi, e
        rows[:, SLOT0] = ptr + pos0 // page_size
        rows[:, ENTRY0], rows[:, POS0] = pos0 % page_size, pos0
        return rows


def _requests(kv_indptr, kv_lens, window_left, page_size) -> _Requests:
    """One item per request, one query each (decode): the q_len = 1 case of query_blocks."""
    L = np.asarray(kv_lens, np.int64)
    return query_blocks(kv_indptr, L, np.ones_like(L), 1, window_left, True, page_size)


def causal_pairs(q_lens, kv_lens) -> int:
    """(query, key) pairs causal attention computes: request b's query i sees kv_len - q_len + i
    + 1 keys (the count the FLOP floor of a prefill step is made of)."""
    q, kv = np.asarray(q_lens, np.int64), np.asarray(kv_lens, np.int64)
    return int((q * (kv - q) + q * (q + 1) // 2).sum())


def query_blocks(kv_indptr, kv_lens, qo_lens, q_block, window_left, causal, page_size) -> _Requests:
    """Work items of ragged queries: request b's ``qo_lens[b]`` query tokens in blocks of
    ``q_block``, in request order (a decode request, q_len 1, is one item even with no keys).

    Query qi of a request with q_len queries and kv_len keys sits at position kv_len - q_len + qi;
    causal, it sees keys below position + 1 (else all kv_len); with a window, none below
    position - window_left (FlashInfer's rule, causal or not). Item rows [out, out + q_block)."""
    T = chunk_tokens(page_size)
    kv = np.asarray(kv_lens, np.int64)
    ql = np.asarray(qo_lens, np.int64)
    nblocks = np.maximum(-(-ql // q_block), 1)
    req = np.repeat(np.arange(kv.size), nblocks)
    q0 = (np.arange(req.size) - np.repeat(np.cumsum(nblocks) - nblocks, nblocks)) * q_block
    last = np.maximum(np.minimum(ql[req] - q0, q_block), 1) - 1       # the block's last real row
    L_req = kv[req]
    q_base = L_req - ql[req] + q0 + 1                 # row 0's causal keys end
    hi_base = q_base if causal else L_req
    L = np.where(ql[req] > 0, np.clip(hi_base + last if causal else L_req, 0, L_req), 0)
    L_lo = np.minimum(np.clip(hi_base, 0, L_req), L)  # the first row's keys end
    span = window_left + 1 if window_left >= 0 else NO_WINDOW
    W = np.where(L > 0, np.maximum(0, q_base - span), 0)
    W_hi = np.where(L > 0, np.maximum(0, q_base + last - span), 0)
    c0, c1 = W // T, -(-L // T)
    full_lo = np.minimum(-(-W_hi // T), c1)
    full_hi = np.maximum(full_lo, L_lo // T)
    ptr = np.asarray(kv_indptr, np.int64)[:kv.size][req]
    return _Requests(ptr, L, W, c0, c1, full_lo, full_hi, np.arange(req.size) * q_block, req, q0,
                     hi_base, q_base, span)


def request_table(kv_indptr, kv_lens, window_left: int, page_size: int, rows: int) -> np.ndarray:
    """[rows, META_COLS] int32: one work item per request (all its chunks), rows past the batch
    are empty requests (L = 0). Columns: kv_indices start (PTR), length L, window start W, chunk
    bounds c0 <= full_lo <= full_hi <= c1, where chunk c0 starts (its kv_indices slot SLOT0 =
    PTR + c0*T // P, page entry ENTRY0, token position POS0 = c0 * T), output row OUT."""
    return _whole_requests(_requests(kv_indptr, kv_lens, window_left, page_size), rows, page_size)


def _whole_requests(req: _Requests, rows: int, page_size: int) -> np.ndarray:
    idx = np.arange(req.L.size)
    table = np.zeros((rows, META_COLS), np.int64)
    table[:idx.size] = req.items(idx, req.c0, req.c1, page_size)
    return table.astype(np.int32)


# Modelled work, in chunk-equivalents (one mask-free chunk inside a block), of the rest of what
# a core does: a work item's fixed cost (request table, q load, state, finalize, its own loop
# iteration) and each further device-loop iteration (the barrier and the pipeline's fill; chunks
# run in blocks of kernel.CHUNK_BLOCKS). Least-squares fit to the dependency-aware schedule on
# trn2 over seven batches (benchmarks/decode_two_cores.py fit): an item 10.28 chunks, an
# iteration 8.56 (bf16, 8 kv heads, G 4, D 128, pages of 16; a chunk of a grouped gather is
# cheap, so the fixed costs weigh more chunks than with one gather per chunk).
ITEM_COST_CHUNKS = 10.28
ITERATION_COST_CHUNKS = 8.56
CHUNK_BLOCKS = (32, 8, 4, 2, 1)    # kernel.CHUNK_BLOCKS (the kernel imports it from here);
                                   # chosen with benchmarks/loop_blocks.py


def loop_iterations(full, masked):
    """Device-loop iterations of a request's chunks: masked ones singly, mask-free ones in blocks
    of CHUNK_BLOCKS, largest first."""
    iterations = np.asarray(masked, np.int64).copy()
    rest = np.asarray(full, np.int64).copy()
    for size in CHUNK_BLOCKS:
        iterations += rest // size
        rest = rest % size
    return iterations


@dataclass(frozen=True)
class DecodeWork:
    """The device tables of one launch.

    items: [rows, META_COLS] int32 work items (request_table's columns, chunk bounds of the part
        of the request the item covers).
    spans: [cores, SPAN_COLS] int32: core p runs items FIRST..END-1 whole and, with two cores,
        item BOUNDARY: its part of the one request split between the cores, whose partial
        softmax states the cores exchange and merge (program 0 writes the result).
    loads: modelled work of each core, in chunk-equivalents (host-side, for reports).
    """

    items: np.ndarray
    spans: np.ndarray
    loads: tuple


FIRST, END, BOUNDARY = range(3)
SPAN_COLS = 3
# Work items per iteration of the kernel's loop over items. A decode item (one query token) is
# a few chunks of work, less than a loop iteration's barrier and pipeline fill, so DECODE_ITEMS
# share one (a core's items padded to a multiple with empty items, which run first and write
# the output row of the core's first real item, rewritten by it); a block of query tokens pays
# its own. Measured (cost model, trn2, bf16 8 kv x 32 q heads, D 128): decode 32 x 4096 2711 us
# with 1 item per iteration, 2462 with 4, 2420 with 8; 15 x 1228: 1273, 1165, 1144 (the program
# doubles from 4 to 8 for 2%).
DECODE_ITEMS_PER_ITERATION = 4


def items_per_iteration(q_block: int, batch_rows: int) -> int:
    """Items per loop iteration for items of ``q_block`` queries in a bucket of ``batch_rows``
    (never more than the bucket: a lone request has no empty items before it)."""
    return min(DECODE_ITEMS_PER_ITERATION, max(1, batch_rows)) if q_block == 1 else 1


def _padded(req: _Requests, idx: np.ndarray, per_iteration: int, page_size: int) -> np.ndarray:
    """Rows of items ``idx`` (whole) led by the empty items that make their count a multiple of
    ``per_iteration``; those take the first item's output row (it is written again after)."""
    pad = (-idx.size) % per_iteration
    rows = np.zeros((pad + idx.size, META_COLS), np.int64)
    if idx.size:
        rows[pad:] = req.items(idx, req.c0[idx], req.c1[idx], page_size)
        rows[:pad, OUT] = req.out[idx[0]]
    return rows


def decode_work(kv_indptr, kv_lens, window_left: int, page_size: int, batch_rows: int,
                cores: int = 1, per_iteration: int = None) -> DecodeWork:
    """Share a decode step between ``cores`` (1, or 2 under LNC=2) program instances.

    Two cores: requests keep their order and the sequence of all their chunks is cut in two
    halves of equal modelled work (chunks, ITERATION_COST_CHUNKS per device-loop iteration and
    ITEM_COST_CHUNKS per item): core 0 takes the requests before the cut, core 1 those after it,
    and the request the cut falls in is split at a chunk boundary (split-KV), so one long request
    uses both cores as evenly as many short ones. Table rows: [boundary of core 0, boundary of
    core 1, core 0's whole requests, core 1's], each core's whole requests led by the empty items
    that make them a multiple of ``per_iteration`` (items_per_iteration); ``batch_rows + 2 +
    2 * (per_iteration - 1)`` rows in all (one core: ``batch_rows + per_iteration - 1``), a
    shape of the batch bucket only.
    """
    if per_iteration is None:
        per_iteration = items_per_iteration(1, batch_rows)
    return split_work(_requests(kv_indptr, kv_lens, window_left, page_size), page_size, batch_rows,
                      cores, per_iteration)


def split_work(req: _Requests, page_size: int, batch_rows: int, cores: int = 1,
               per_iteration: int = 1) -> DecodeWork:
    """decode_work over any work items (requests or query blocks, ``query_blocks``)."""
    U = per_iteration
    B = req.L.size
    chunks = (req.c1 - req.c0).astype(np.float64)
    masked = (req.full_lo - req.c0) + (req.c1 - req.full_hi)
    work = chunks + ITERATION_COST_CHUNKS * loop_iterations(req.full_hi - req.full_lo, masked)
    if cores == 1:
        table = np.zeros((batch_rows + U - 1, META_COLS), np.int64)
        rows = _padded(req, np.arange(B), U, page_size)
        table[:len(rows)] = rows
        return DecodeWork(table.astype(np.int32), np.array([[0, len(rows), 0]], np.int32),
                          (float(work.sum() + ITEM_COST_CHUNKS * B),))
    if cores != 2:
        raise ValueError(f"cores={cores!r} must be 1 or 2")
    table = np.zeros((batch_rows + 2 + 2 * (U - 1), META_COLS), np.int64)
    if B == 0:                 # both boundary items: the empty padding request 0
        return DecodeWork(table.astype(np.int32), np.array([[2, 2, 0], [2, 2, 1]], np.int32),
                          (0.0, 0.0))
    cum = np.cumsum(work + ITEM_COST_CHUNKS)
    total = float(cum[-1])
    k = min(int(np.searchsorted(cum, total / 2)), B - 1)     # the request the cut falls in
    before, after = (float(cum[k - 1]) if k else 0.0), total - float(cum[k])
    # core 0 takes chunks [c0, c0 + s) of request k, core 1 the rest: equal loads (request k's
    # work taken as spread evenly over its chunks)
    share = np.clip((after - before + work[k]) / 2, 0.0, work[k])
    s = int(round(share / work[k] * chunks[k])) if work[k] else 0
    ck = req.c0[k]
    table[0:2] = req.items(np.array([k, k]), np.array([ck, ck + s]),
                           np.array([ck + s, req.c1[k]]), page_size)
    first = _padded(req, np.arange(k), U, page_size)              # core 0's whole requests
    second = _padded(req, np.arange(k + 1, B), U, page_size)      # core 1's
    mid = 2 + len(first)
    table[2:mid], table[mid:mid + len(second)] = first, second
    spans = np.array([[2, mid, 0], [mid, mid + len(second), 1]], np.int32)
    part = work[k] * s / chunks[k] if chunks[k] else 0.0
    loads = (before + ITEM_COST_CHUNKS + part, after + ITEM_COST_CHUNKS + work[k] - part)
    return DecodeWork(table.astype(np.int32), spans, loads)
