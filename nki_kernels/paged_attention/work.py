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

import functools
import itertools
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from nki_kernels.buckets import (bucket_floor, static_sections_mode, tail_profile_mode,
                                 tail_slots_mode)

# Columns of the work-item table: [items, META_COLS] int32. An item is a request, or a block of
# a request's query tokens (query rows [OUT, OUT + q_block) of the padded q), or the part of
# either that one core takes. Keys of query row qi of the block: [W_r, L_r) with
# L_r = min(HI_BASE + qi, LEN) and W_r = max(0, Q_BASE + qi - W_SPAN); LEN / WIN are the largest
# L_r / smallest W_r of the block's real rows (what the item gathers).
# NEXT (flat list, on an iteration's first item): the first row of the core's next loop
# iteration, whose rows the kernel loads while this iteration runs (``iteration_starts``).
PTR, LEN, WIN, C0, FULL_LO, FULL_HI, C1, SLOT0, ENTRY0, POS0, OUT, HI_BASE, Q_BASE, W_SPAN, \
    LOAD, STORE, NEXT = range(17)
META_COLS = 17
# Whole units (chunked prefill) use no scratch. Their LOAD column is ROUNDS: the rounds of
# ROUND_CHUNKS mask-free chunks just before their tails that the units of a loop iteration fold
# together (``kernel_items.group_rounds``, ``group_rounds_of``); STORE is ROUNDS1, the rounds of
# one chunk just before those; NEXT is ROUND_SLOT, the page-list slot of the chunks a unit's
# first round folds (the kernel moves it back a round at a time).
ROUNDS = LOAD
ROUNDS1 = STORE
ROUND_SLOT = NEXT
assert ROUNDS1 == ROUNDS + 1          # the kernel reads both from one [1, 2] view
ROUND_CHUNKS = 4
ROUNDS_MAX = 8
ROUNDS1_MAX = ROUND_CHUNKS - 1
# A loop iteration's whole units choose their tail starts together with their rounds
# (``group_tails``: some leave tail slots empty to share rounds rather than each run a loop
# iteration of its own; cost model, trn2, chunked replays of 64 LNC=1 505.5 -> 496.0 us a step,
# LNC=2 295.2 -> 286.2); False: each unit's own best start, then the rounds they allow.
GROUP_TAILS = True
NO_WINDOW = 1 << 24          # W_SPAN without a sliding window: every W_r clamps to 0
MAX_KV_LEN = NO_WINDOW - 1   # keys per request: positions stay exact in the kernel's fp32 ALU


def chunk_tokens(page_size: int) -> int:
    if page_size <= 128:
        return (128 // page_size) * page_size
    if page_size % 128:
        raise ValueError(f"page_size={page_size}: the decode kernel takes page sizes <= 128 or "
                         f"multiples of 128")
    return 128


def token_table(page_size: int) -> np.ndarray:
    """[T, 2] int32: page slot and entry of chunk-local token t, relative to the chunk's first
    token (a chunk starts on a page boundary when P <= 128, inside one page otherwise)."""
    t = np.arange(chunk_tokens(page_size))
    if page_size <= 128:
        return np.stack([t // page_size, t % page_size], axis=1).astype(np.int32)
    return np.stack([np.zeros_like(t), t], axis=1).astype(np.int32)


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
    first_row: object = None   # the item's first real row (``right_aligned``), None: row 0

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
    last = _last_rows(ql[req], q0, q_block)
    L_req = kv[req]
    q_base = L_req - ql[req] + q0 + 1                 # row 0's causal keys end
    hi_base = q_base if causal else L_req
    L = np.where(ql[req] > 0, np.clip(hi_base + last if causal else L_req, 0, L_req), 0)
    L_lo = np.minimum(np.clip(hi_base, 0, L_req), L)  # the first row's keys end
    span = window_span(window_left)
    W = np.where(L > 0, np.maximum(0, q_base - span), 0)
    W_hi = np.where(L > 0, np.maximum(0, q_base + last - span), 0)
    c0, c1 = W // T, -(-L // T)
    full_lo = np.minimum(-(-W_hi // T), c1)
    full_hi = np.maximum(full_lo, L_lo // T)
    ptr = np.asarray(kv_indptr, np.int64)[:kv.size][req]
    return _Requests(ptr, L, W, c0, c1, full_lo, full_hi, np.arange(req.size) * q_block, req, q0,
                     hi_base, q_base, span)


def _last_rows(q_lens, q0, q_block):
    """Each block's last real row: of a request of ``q_lens`` queries, the block from its query
    ``q0`` (row 0 when it has none)."""
    return np.maximum(np.minimum(q_lens - q0, q_block), 1) - 1


def right_aligned(req: _Requests, qo_lens, q_block: int) -> _Requests:
    """``query_blocks``' causal items with each request's last block of queries at the end of
    its rows (padding rows first, not last), so row qi of every item sits at position
    LEN - q_block + qi: which of a whole unit's tail slots a tile of its rows can need is then
    static (``kernel_items.diagonal_columns``). Only the rows move: the items' keys (L, W and
    the chunk bounds, set by their real rows) stay; a padding row (before ``first_row``; its
    bounds may hold no key, or keys the item does not gather) has its output dropped."""
    ql = np.asarray(qo_lens, np.int64)[req.request]
    shift = q_block - 1 - _last_rows(ql, req.q0, q_block)
    return req._replace(q0=req.q0 - shift, hi_base=req.hi_base - shift,
                        q_base=req.q_base - shift, first_row=shift)


def window_span(window_left: int) -> int:
    """W_SPAN of a window: window_left + 1 keys, or NO_WINDOW for -1 and for any window at least
    as long as a sequence can be (keys stay below MAX_KV_LEN, so such a window keeps them all;
    the int32 table and the fp32 index arithmetic never see a larger number)."""
    return NO_WINDOW if window_left < 0 or window_left >= MAX_KV_LEN else int(window_left) + 1


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
# a core does: a work item's fixed cost (its table row, q load, the softmax state it loads,
# stores and finalizes) and each device-loop iteration (the barrier and the pipeline's fill).
# Least-squares fit to the dependency-aware schedule on trn2 (benchmarks/decode_two_cores.py
# fit over nine batches, 16 items per iteration as one software pipeline; bf16, 8 kv heads, G 4,
# D 128, pages of 16): an item 3.02 chunks, an iteration 8.31 (5.76 / 6.02 at 8 items an
# iteration before the pipeline; the cuts of benchmarks/decode_two_cores.py's cases and the
# workload suite's LNC=2 rows came out the same either way).
ITEM_COST_CHUNKS = 3.02
ITERATION_COST_CHUNKS = 8.31
# The LNC=2 cut of a flat list prices an item at one chunk: inside a pipelined iteration of 16
# an item's fixed cost is mostly hidden (the fit above, redone with the iterations of today,
# gives 0.53; with one-page requests added 0.68). Chosen over 21 LNC=2 steps (the suite's
# decode, verification, mixed and cascade rows, and skewed batches: one long request among
# one-page ones, two of 8k among thirty of 200): 1 x 2048 + 15 x 16 84.0 -> 61.7 us, 2 x 8000
# + 30 x 200 350.6 -> 297.9, 12 x 500-620 110.4 -> 105.8, 32 x 64-2048 401.4 -> 408.7, the
# others unchanged; 0.53 (and the refit 7.24 an iteration) also gains there but takes 1 x 4096
# + 7 x 100 from 74.6 to 81.9. The static-pass policy and the null-item padding keep
# ITEM_COST_CHUNKS / ITERATION_COST_CHUNKS, the costs they were fitted against.
CUT_ITEM_COST_CHUNKS = 1.0
CUT_ITERATION_COST_CHUNKS = ITERATION_COST_CHUNKS
# Mask-free chunks of one work item, largest first (a request's mask-free chunks: as many
# blocks of 32 as fit, then at most one of each smaller size); chosen with benchmarks/loop_blocks.py
CHUNK_BLOCKS = (32, 16, 8, 4, 2, 1)
# Kinds of work item, each with its own device loop whose body is that kind's static program:
# (chunks, masked): an item with no keys (it only writes its empty result), a unit's first masked
# chunk, its further masked chunks (a sliding window's start, a query block straddling chunks),
# then the mask-free blocks. The kernel runs the loops in this order.
# With tails (``tail_items``) a unit's last chunks, its masked tail and the mask-free chunks
# past its last whole block of TAIL_CHUNKS, are one masked item of TAIL_CHUNKS chunks instead
# (the slots past its keys read nothing): the unit's mask-free blocks are then multiples of
# TAIL_CHUNKS, and a verification step runs two or three kinds of item (two or three loops)
# instead of up to five. Decode's tails are late (LATE_TAILS: no empty slots, one zeroed V slot).
TAIL_CHUNKS = 4
ITEM_CLASSES = ((0, False), (1, True), (TAIL_CHUNKS, True), (1, True)) + tuple(
    (size, False) for size in CHUNK_BLOCKS)
FIRST_MASKED = 1                    # the kind of a unit's first masked chunk
TAIL = 2                            # the kind of a unit's tail (with tails)
MASKED_AGAIN = 3                    # the kind of a unit's further masked chunks


def chains_in(kind: int) -> bool:
    """Whether the items of ``kind`` start from their unit's state (loaded from its scratch slot
    with their setup) instead of merging it in at their end: kinds with at most one item per
    unit, so no two items of one unit share a loop iteration (the state an item loads was
    stored by an earlier loop). A unit's further masked chunks and its blocks of
    CHUNK_BLOCKS[0] chunks may repeat: those items merge."""
    return kind != MASKED_AGAIN and ITEM_CLASSES[kind][0] != CHUNK_BLOCKS[0]


def starts_fresh(kind: int) -> bool:
    """Whether the items of ``kind`` are always their unit's first on their core, so they start
    from the identity state without loading it: a unit's first masked chunk, its tail (the kinds
    run in ITEM_CLASSES order, a unit with a tail has no FIRST_MASKED item, and only units with
    no keys have an item of kind 0)."""
    return kind in (FIRST_MASKED, TAIL)


def tail_items(nc_version: int, page_size: int, cache_rows: int, whole: bool = False,
               query_tiles: int = 1) -> bool:
    """Whether a flat list's units end in a TAIL item: the kernel gathers its masked chunks as
    one block (indirect DMA, NeuronCore-v3+, pages of at most 128 tokens, a cache of fewer than
    2**24 rows) with one mask predicate, its items' queries one tile of score rows
    (``query_tiles``: tiles of a unit's queries, 128 // group each), not whole units."""
    return (nc_version >= 3 and page_size <= 128 and cache_rows < 1 << 24 and not whole
            and query_tiles == 1)


def loop_widths(per_iteration: int) -> list:
    """Items per iteration of each loop over one kind of item: ``per_iteration`` (a power of
    two), then the halves down to 1 for the remainder (at most one iteration each). Kernel code:
    an assertion names a bad value (NKI has no ``raise``)."""
    assert per_iteration >= 1 and per_iteration & (per_iteration - 1) == 0, (
        f"per_iteration={per_iteration!r} must be a power of two")
    widths = []
    while per_iteration:
        widths.append(per_iteration)
        per_iteration //= 2
    return widths


def span_cols(per_iteration: int) -> int:
    """Columns of a core's span row: [first, end) per (item kind, loop width), then START (the
    row of the core's first loop iteration, ``span_start``), BSLOT, BOUT."""
    return 2 * len(ITEM_CLASSES) * len(loop_widths(per_iteration)) + 3


def span_start(per_iteration: int) -> int:
    """Column of START in a span row: the first row of the core's first loop iteration."""
    return span_cols(per_iteration) - 3


def span_column(kind: int, width: int, per_iteration: int) -> int:
    """Column of the FIRST of item kind ``kind``'s loop of ``width`` items per iteration (its END
    follows)."""
    widths = loop_widths(per_iteration)
    return 2 * (kind * len(widths) + widths.index(width))


def state_slots(units: int) -> int:
    """Softmax-state slots of the kernel's HBM scratch: one per unit (request or query block),
    one per core for the request split between the two (``split_slot``), and the identity
    state last. The slot past these is a null item's: its state's load and store skip it
    (work.NullItems)."""
    return units + 3


def split_slot(units: int, core: int) -> int:
    """The scratch slot of core ``core``'s part of the unit split between two cores."""
    return units + core


def table_rows(units: int, capacity_chunks: int, sharing: int = 1) -> int:
    """Static bound on the work items of a launch over ``units`` units whose keys fill at most
    ``capacity_chunks`` chunks, each key read by at most ``sharing`` units (query blocks of one
    request read the same keys): per unit two masked chunks, one block of each size below the
    largest (per part: the split unit has two) and an empty item, plus the largest blocks, plus
    the null items that pad loop iterations (NULL_ROWS), plus the rows an iteration's load of
    the next one's may read past the last (``iteration_starts``)."""
    return (8 * units + 10 + sharing * (capacity_chunks // CHUNK_BLOCKS[0]) + NULL_ROWS
            + DECODE_ITEMS_PER_ITERATION)


def capacity_chunks(capacity_pages: int, page_size: int) -> int:
    """Chunks the pages of a page table of ``capacity_pages`` entries can hold."""
    return capacity_pages * page_size // chunk_tokens(page_size) + 1


@dataclass(frozen=True)
class DecodeWork:
    """The device tables of one launch.

    items: [rows, META_COLS] int32 work items: a unit (request, or block of a request's queries)
        over one kind of chunk range (ITEM_CLASSES), its softmax state chained through the
        scratch slot STORE (loaded from LOAD: the unit's slot, or the identity for its first
        item on the core); unused rows zero.
    spans: [cores, span_cols(U)] int32: per item kind and loop width, the rows [first, end) the
        core runs in that loop; BSLOT / BOUT: with two cores, the scratch slot of the core's part
        of the one unit split between the cores (the identity slot if it has none) and that
        unit's output row (program 0 merges the two parts and writes it). The kernel reads the
        part from slot units + p, which it sets to the identity first (a static DMA at the
        merge); BSLOT says which slot the part's items keep it in.
    loads: modelled work of each core, in chunk-equivalents (host-side, for reports).
    tail_profile: the whole units' tail slots per body and unit position of
        ``kernel.run_whole_units`` (``tail_profile``; the first lead group's longer tail,
        ``lead_tail_slots``, among them), or (): a static kernel argument.
    """

    items: np.ndarray
    spans: np.ndarray
    loads: tuple
    tail_profile: tuple = ()


# Work items per iteration of the kernel's loops over items. A decode item (one query token) is
# a few chunks of work, less than a loop iteration's barrier and pipeline fill, so DECODE_ITEMS
# share one, software-pipelined as one stream (kernel_items.fold_items). Measured (cost model,
# trn2, bf16 8 kv x 32 q heads, D 128; short-chat decode 32 x 256 / 8 x 1024 / long 32 x 4096):
# 4 items 368 / 170 / 1800 us, 8: 313 / 158 / 1749, 16: 286 / 153 / 1685, 32: 272 / 153 / 1666
# (32 doubles the unrolled program for 5%); benchmarks/loop_blocks.py has the older sweep.
DECODE_ITEMS_PER_ITERATION = 16


# Large blocks of queries (chunked prefill) are whole work items instead: one item per unit (per
# core's part of it), its chunks folded by loops nested in the item (a loop per kind of chunk
# range, trip counts from its table row), the softmax state kept in SBUF throughout. A block's
# state is up to 8 x 128 rows x (D + 2) fp32 per kv-head tile (4 MB at 8 kv heads, D 128); chained
# through HBM per kind of chunk range it moved more bytes than its keys (1k prefill trn2: 4757 us
# as a flat list, 1953 whole). Blocks of up to FLAT_LIST_MAX_QUERIES queries (speculative
# verification) are items of the flat list like decode: their state is one or a few tiles, and
# whole, each unit paid a loop barrier per kind of chunk range (cost model, trn2, Llama-3-8B
# layer: verify 16 x 4 drafts x 1024 1410 us whole, 670 flat; 8 x 8 x 2048 1012 / 696; 8 x 16
# x 1024 886 / 821; 8 x 32 x 1024 1028 / 1352, so 32 queries stay whole).
FLAT_LIST_MAX_QUERIES = 16
WHOLE_UNIT_SPAN_COLS = 4          # FIRST, END of the core's whole units; its part of the split
                                  # one; 1 if there is a split unit, else 0


def whole_units(q_block: int) -> bool:
    """Whether items of ``q_block`` queries run as whole units (see WHOLE_UNIT_SPAN_COLS): blocks
    of more than FLAT_LIST_MAX_QUERIES queries."""
    return q_block > FLAT_LIST_MAX_QUERIES


# A whole unit ends in a tail of up to UNIT_TAIL_CHUNKS chunk slots folded without a loop (one
# masked softmax step): its masked chunks at the causal edge and the mask-free ones before
# them down to the tail's start, so the unit runs fewer loop iterations (a barrier and a
# pipeline fill each) than with loops for them; slots past its keys read nothing but still cost
# their scores' compute. The slots are one static kernel argument for all the launch's units:
# per launch, of the sizes buckets.tail_slots_mode allows (2, 4 or 8 unless set), the one whose
# loop iterations and empty slots cost least over them (``unit_tail_slots``; cost model, trn2,
# Llama-3-8B layer, one launch each: eight prompt chunks of 64 queries over 64 keys 204 us with
# four slots, 151 with one; of 128 over 129-256 keys 457 / 375 with two; four chunks of 256 over
# 256-1500 keys 651 with four, 689 with eight; two chunks of 512 over 900-1500 keys 730 / 696
# with eight).
UNIT_TAIL_CHUNKS = 8
UNIT_TAIL_BYTES = 32 * 1024      # SBUF per partition a tail's K and V may take


def unit_tail_chunks(nc_version: int, page_size: int, cache_rows: int, custom_mask: bool,
                     chunk_bytes: int = 0) -> int:
    """Most chunk slots of a whole unit's tail (``with_unit_tail``), 0 for none: NeuronCore-v3+
    on the indirect path (pages of at most 128 tokens, a cache of fewer than 2**24 rows), no
    custom mask (its table has no rows past a unit's chunks), a power of two up to
    UNIT_TAIL_CHUNKS whose K and V (``chunk_bytes`` per partition a chunk) fit UNIT_TAIL_BYTES,
    at least 4 of them. ``unit_tail_slots`` picks a launch's from 1 to this."""
    if not (nc_version >= 3 and page_size <= 128 and cache_rows < 1 << 24 and not custom_mask):
        return 0
    slots = UNIT_TAIL_CHUNKS
    while slots > 4 and slots * chunk_bytes > UNIT_TAIL_BYTES:
        slots //= 2
    return slots if slots * chunk_bytes <= UNIT_TAIL_BYTES else 0


def unit_tail_slots(limit: int, units, choices=(1, 2, 4, 8)) -> int:
    """Tail slots of a launch's whole units ``units`` ([(C0, FULL_LO, FULL_HI, C1)] chunk
    bounds each): of ``choices`` (``buckets.tail_slots_mode``) up to ``limit``
    (``unit_tail_chunks``, 0 for none; ``limit`` itself when no choice fits), the one whose
    loop iterations and empty slots (``unit_tail_cost``), plus UNIT_TAIL_SLOT a slot, sum least
    over the units, the fewer slots on ties: steps of prompts' first chunks take the small
    ones, long prefixes the large. A static argument: a bucket compiles once per size it
    meets."""
    if not limit:
        return 0
    units = [tuple(int(x) for x in unit) for unit in units]
    sizes = sorted(size for size in choices if size <= limit) or [limit]
    best, best_cost = sizes[0], None
    for slots in sizes:
        cost = 0.0
        for c0, lo, hi, c1 in units:
            cost += unit_tail_cost(c0, lo, hi, c1, slots)[0] + UNIT_TAIL_SLOT * slots
        if best_cost is None or cost < best_cost - 1e-9:
            best, best_cost = slots, cost
    return best


# An empty tail slot against a loop iteration (assumed). Measured over the chunked replays'
# multi-unit launches: 0.006-0.009 an iteration per score tile of the unit (0.1 for units of 64
# Llama-3-8B queries, 0.5 for 256); it decides only between the sizes a launch may take. With
# UNIT_TAIL_SLOT these pick sizes 2, 4 or 8 within 2% (in total) of the best per launch over
# the chunk-64 and chunk-128 LNC=2 replays' prefill launches (each re-run under every size;
# 0.01 a slot did 0.3% better there but gave eight slots to four chunks of 256 over 256-1500
# keys, 689 us against 651 with four)
UNIT_TAIL_EMPTY_SLOT = 0.3
UNIT_TAIL_SLOT = 0.02            # any slot of a tail (its SBUF, its step's length; fitted)


def unit_tail_cost(c0: int, lo: int, hi: int, c1: int, slots: int, rounds: bool = False,
                   taken: int = 0):
    """(cost, ts) of a unit over chunks [c0, c1) (mask-free [lo, hi)) with a tail of ``slots``
    from ts: its loop iterations plus UNIT_TAIL_EMPTY_SLOT per empty slot, least over ts in
    [max(c0, c1 - slots), c1] (ties to the later start). ``rounds``: the mask-free chunks
    before ts may be folded in rounds instead (``_rounded_loop_cost``). ``taken`` > 0: the
    group's rounds fold the ``taken`` chunks before ts, which must be mask-free, and its loops
    end there (``group_tails``); None when no ts allows that. Memoized on the bounds relative
    to c0 (the planning asks the same few shapes for every unit and group: a chunked-prefill
    launch's host time was mostly these searches)."""
    c0, lo, hi, c1, slots, taken = (int(x) for x in (c0, lo, hi, c1, slots, taken))
    found = _unit_tail_search(lo - c0, hi - c0, c1 - c0, slots, bool(rounds), taken,
                              UNIT_TAIL_EMPTY_SLOT, ROUND_CHUNKS, ROUNDS_MAX, ROUNDS1_MAX,
                              CHUNK_BLOCKS)
    return None if found is None else (found[0], found[1] + c0)


@functools.lru_cache(maxsize=1 << 16)
def _unit_tail_search(lo, hi, c1, slots, rounds, taken, *constants):
    """``unit_tail_cost`` of a unit whose chunks start at 0 (``constants``: the module's, so a
    changed one is a new entry)."""
    loops = _rounded_loop_cost if rounds else _unit_loop_cost
    first, last = max(0, c1 - slots), c1
    if taken:
        first, last = max(first, lo + taken), min(last, hi)
        if first > last:
            return None

    def cost(t):
        return loops(0, lo, hi, t - taken) + UNIT_TAIL_EMPTY_SLOT * (slots - c1 + t), -t
    ts = min(range(first, last + 1), key=cost)
    return cost(ts)[0], ts


def _rounded_loop_cost(c0: int, lo: int, hi: int, end: int) -> float:
    """``_unit_loop_cost`` of [c0, end) when rounds (``group_rounds_of``) may fold the mask-free
    chunks that end at ``end``: the fewest loop iterations left plus a quarter per round (a
    round is one barrier for the loop iteration's units, ~4 of them)."""
    free = end - lo if hi >= end else 0
    best = float(_unit_loop_cost(c0, lo, hi, end))
    for fours in range(min(ROUNDS_MAX, free // ROUND_CHUNKS) + 1):
        for ones in range(min(ROUNDS1_MAX, free - fours * ROUND_CHUNKS) + 1):
            taken = fours * ROUND_CHUNKS + ones
            best = min(best, _unit_loop_cost(c0, lo, hi, end - taken) + (fours + ones) / 4)
    return best


def _unit_loop_cost(c0: int, lo: int, hi: int, end: int) -> int:
    """Loop iterations of a whole unit's chunks [c0, end) (``kernel_items.unit``): masked pairs
    and a single for [c0, lo), the mask-free blocks of CHUNK_BLOCKS in [lo, min(hi, end)), then
    masked pairs and a single for what is left."""
    lo = min(lo, end)
    free = max(0, min(hi, end) - lo)
    n = (lo - c0) // 2 + (lo - c0) % 2
    for size in CHUNK_BLOCKS[:-1]:
        trips = free // size
        n += trips if size == CHUNK_BLOCKS[0] else min(trips, 1)
        free -= trips * size
    rest = end - max(lo, min(hi, end)) + free
    return n + rest // 2 + rest % 2


# Whole units a loop iteration takes at most (kernel_items.unit_group_begin: their setups and
# tails ahead of the units' loops; cost model, trn2, 8 prompt chunks of 128 tokens
# over 128 keys 550 -> 480 us with two an iteration, 454 with four), on NeuronCore-v3+ and while
# their states and queries take at most WHOLE_GROUP_BYTES of SBUF a partition (a Llama-3-8B
# unit of 128 queries: 25 KiB, of 256: 49 KiB; two fp32 units of 8 kv heads overflowed trn1's
# SBUF beside their gathers). Eight only when each core is sure to hold eight (a lead group:
# with fewer, a group of eight would cost the lead groups that run without a loop): units of
# 64 queries, LNC=1, six launches of 9-16 prompt chunks over 100-3000 keys 3584.3 -> 3487.9 us
# in all (ten over 100-1500 keys 409.4 -> 431.0, the five others faster), the chunk-64 replay
# 496.0 -> 487.6 us a step.
WHOLE_UNITS_PER_ITERATION = 8
WHOLE_UNITS_BEFORE_LEAD = 4
WHOLE_GROUP_BYTES = 128 * 1024


def score_tiling(kv_heads: int, group: int, q_block: int):
    """(query tokens per tile, kv heads per tile, tiles, rows per tile) of a work item's score
    rows: rows = kv heads x group x tokens <= 128 (``kernel.make_step``)."""
    tokens = min(q_block, 128 // group)
    heads = max(1, min(kv_heads, 128 // (group * tokens)))
    return tokens, heads, -(-kv_heads // heads) * (q_block // tokens), heads * group * tokens


def whole_group_units(tiles: int, rows: int, head_dim: int, mm_bytes: int,
                      nc_version: int, core_units: int = 0) -> int:
    """Whole units the first loop iteration over them takes (``kernel.run_whole_units``): a
    power of two up to WHOLE_UNITS_PER_ITERATION whose states and queries (``tiles`` tiles of
    ``rows`` score rows each) fit WHOLE_GROUP_BYTES, on NeuronCore-v3+; one on v2. More than
    WHOLE_UNITS_BEFORE_LEAD only when each core is sure to hold that many (``core_units``: the
    bucket's least size, a core's share; the kernel passes its ``lead_units``)."""
    unit_bytes = tiles * ((head_dim + 2) * 4 + rows * mm_bytes * (-(-head_dim // 128)))
    per = 1
    while nc_version >= 3 and per < WHOLE_UNITS_PER_ITERATION and \
            2 * per * unit_bytes <= WHOLE_GROUP_BYTES and \
            (2 * per <= WHOLE_UNITS_BEFORE_LEAD or 2 * per <= core_units):
        per *= 2
    return per


def lead_units(batch_rows: int, cores: int, whole: bool, per: int = 1) -> int:
    """Whole units each core of a launch of ``batch_rows`` unit rows (a bucket) is sure to hold
    and folds without a device loop, as a static kernel argument: of the bucket's least size
    (``buckets.bucket_floor``), a core's share, so the program stays one per bucket;
    ``kernel.run_whole_units`` folds their ``lead_groups`` (``per`` units a group at most)
    without a loop (no barrier, no pipeline fill between them), and under LNC=2
    ``_whole_halves`` gives each core at least that many. When smaller launches share the
    bucket, only whole groups of ``per`` (or one power of two below ``per``): a part group
    would leave the loops after it a part group too (a bucket of 16 on one core: 8 of its
    9); a bucket no smaller launch shares (``buckets.BucketPolicy(exact=True)``) takes every
    unit. 0 for other launches."""
    if not whole:
        return 0
    least = bucket_floor(batch_rows)
    lead = least // cores
    if least == batch_rows:
        return lead
    if lead >= per:
        return lead // per * per
    size = 1
    while 2 * size <= lead:
        size *= 2
    return size if size > 1 else 0


def launch_lead(lead: int, batch_rows: int, cores: int, units: int) -> int:
    """``lead_units``' count raised, for a launch of ``units`` whole units, to the highest level
    it reaches of ``lead``, the level halfway from there to the bucket's share a core
    (``batch_rows // cores``; skipped when it is less than two units past ``lead``: a lead group
    of one unit alone folds no rounds) and that share: the levels ``buckets.lead_mode``
    "launch" adds, each a program of its own. A launch of twelve units in a bucket of 16 folds
    12 a core without a loop on one core, 6 on two (``lead_units``: 8 and 4; cost model, trn2,
    twelve chunks of 96 queries over 100-1000 keys 434.1 -> 421.2 us LNC=1, 219.5 -> 207.6
    LNC=2). ``lead`` itself when it is 0."""
    top = batch_rows // cores
    if not lead or top <= lead:
        return lead
    have = min(top, units // cores)
    mid = lead + (top - lead + 1) // 2
    if have == top:
        return top
    if have >= mid and mid - lead >= 2:
        return mid
    return lead


def lead_groups(lead: int, per: int) -> list:
    """Sizes of the groups of the first ``lead`` units (``lead_units``) that run without a loop,
    in order: as many groups of ``per`` as they fill, then the rest in powers of two, largest
    first (a core's six units at four a group: four, then two)."""
    groups = [per] * (lead // per)
    rest, size = lead % per, per
    while rest:
        size //= 2
        if rest >= size:
            groups.append(size)
            rest -= size
    return groups


def unit_groups(first: int, end: int, per: int, lead: int = 0):
    """[first, end) split as ``kernel.run_whole_units`` runs them: [(start, units)] the
    ``lead_groups`` of ``lead`` units, then groups of ``per``, then at most one of each smaller
    power of two; one unit alone runs no rounds. The kernel runs the lead groups whatever the
    core holds, so a core with fewer than ``lead`` units is a planning error."""
    if end - first < lead:
        raise AssertionError(f"a core holds {end - first} whole units, fewer than the {lead} "
                             f"its lead groups run (work.lead_units)")
    groups = []
    for n in lead_groups(lead, per):
        groups.append((first, n))
        first += n
    while per > 1:
        n = (end - first) // per * per
        groups.extend((a, per) for a in range(first, first + n, per))
        first += n
        per //= 2
    return groups


# Tail slots a body of ``kernel.run_whole_units`` may give a unit position under
# NKI_KERNELS_TAIL_PROFILE=exact (``tail_profile``): its steps fold four chunks each, the last fewer
TAIL_SIZES = (1, 2, 3, 4, 6, 8)


def unit_bodies(lead: int, per: int) -> int:
    """The bodies ``kernel.run_whole_units`` folds whole units in: its ``lead_groups``, then its
    loops over groups of per, per/2, ..., 2 units, then the loop over single units."""
    bodies = len(lead_groups(lead, per)) + 1
    while per > 1:
        bodies += 1
        per //= 2
    return bodies


def flat_sizes(profile) -> list:
    """Every tail size of a ``tail_profile`` (an entry per body: one size a unit position)."""
    sizes = []
    for entry in profile:
        sizes.extend(entry)
    return sizes


def body_groups(spans, per: int, lead: int):
    """(body, first row, units) of every group ``kernel.run_whole_units`` folds, core by core:
    its ``unit_groups`` and then the loop over single units; a body (``unit_bodies``) is a
    lead group's own, or the loop over groups of its size."""
    leading = len(lead_groups(lead, per))
    for first, end in spans[:, :2]:
        first, end = int(first), int(end)
        groups = unit_groups(first, end, per, lead)
        done = sum(n for _, n in groups)
        groups.extend((a, 1) for a in range(first + done, end))     # the single units' loop
        for g, (start, n) in enumerate(groups):
            yield (g if g < leading else leading + (per // n).bit_length() - 1), start, n


def _tail_needs(rows, spans, per: int, lead: int, page_size: int) -> list:
    """Per body of ``kernel.run_whole_units`` (``unit_bodies``), per unit position: the most
    chunks any core's unit there holds from its tail start (C1) to its last key (at least 1)."""
    T = chunk_tokens(page_size)
    need = [dict() for _ in range(unit_bodies(lead, per))]
    for body, start, n in body_groups(spans, per, lead):
        for k in range(n):
            row = rows[start + k]
            chunks = -(-int(row[LEN]) // T) - int(row[C1])
            need[body][k] = max(need[body].get(k, 1), chunks)
    return need


def tail_profile(rows, spans, per: int, lead: int, slots: int, lead_tail, page_size: int,
                 sizes=(2, 4, 8), mode: str = "lead") -> tuple:
    """The static kernel argument of the whole units' tail slots per body of
    ``kernel.run_whole_units`` and unit position (the kernel gives a body past the tuple the
    launch's ``slots`` at every position). A lead group's body takes its ``lead_tail`` entry
    (``lead_tail_slots``) when set, other bodies ``slots``; a position may take fewer when
    every core's unit there needs fewer (``_tail_needs``): its rows stay the same (a tail's
    slots past its unit's keys read nothing), only the keys scored shrink. ``mode``
    (``buckets.tail_profile_mode``; ``_split_table`` keeps "lead" to LNC=2): "lead": each lead
    group's positions take half the slots where all units there fit and half is one of
    ``sizes``, the sizes falling along the group (its units are its core's longest, in order),
    so a bucket compiles a few programs more, not one per length pattern (cost model, trn2,
    twelve chunks of 96 queries over 100-1000 keys: 254.5 -> 235.1 us under LNC=2); "exact":
    every body and position the least of TAIL_SIZES that fits (254.5 -> 216.3 us, 471.8 -> 432.8
    under LNC=1; but about a program a step in a serving loop); "ladder": as "lead", on one
    core too, each position the least of the group's size and its LADDER_EIGHTHS that fits
    (434.1 -> 394.8 us LNC=1, 219.5 -> 210.6 LNC=2, for more programs: ``_position_fits``);
    "off": each lead group's ``lead_tail`` alone, as one size.
    """
    leading = lead_groups(lead, per)
    if not leading or mode == "off":
        return tuple((lead_tail_of(lead_tail, b) or slots,) * leading[b]
                     for b in range(len(lead_tail)))
    need = _tail_needs(rows, spans, per, lead, page_size)
    profile = []
    for body in range(len(need) if mode == "exact" else max(1, len(lead_tail))):
        top = (lead_tail_of(lead_tail, body) if body < len(leading) else 0) or slots
        width = leading[body] if body < len(leading) else max(1, per >> (body - len(leading)))
        fit = _position_fits([need[body].get(k, top) for k in range(width)], top, mode, sizes)
        profile.append(tuple(fit))
    while profile and all(s == slots for s in profile[-1]):
        profile.pop()                  # the kernel's default: the launch's slots
    return tuple(profile)


def _rounds_free(row) -> int:
    """Mask-free chunks of a whole unit's row that end at its tail (C1)."""
    return int(row[C1] - row[FULL_LO]) if row[FULL_HI] >= row[C1] else 0


def group_rounds_of(rows) -> tuple:
    """(rounds of ROUND_CHUNKS, then of one chunk) the loop iteration of whole units ``rows``
    folds together (``kernel_items.group_rounds``): each unit's loops then cover its chunks up
    to its last rounds'. The pair whose loop iterations, the units' own plus one a round (a
    round pays one barrier and pipeline fill for all the units), are fewest; the fewer rounds
    on ties."""
    free = min(_rounds_free(row) for row in rows)

    def cost(fours, ones):
        taken = fours * ROUND_CHUNKS + ones
        return sum(_unit_loop_cost(int(r[C0]), int(r[FULL_LO]), int(r[FULL_HI]),
                                   int(r[C1]) - taken) for r in rows) + fours + ones
    best = (cost(0, 0), 0, 0)
    for fours in range(min(ROUNDS_MAX, free // ROUND_CHUNKS) + 1):
        for ones in range(min(ROUNDS1_MAX, free - fours * ROUND_CHUNKS) + 1):
            best = min(best, (cost(fours, ones), fours, ones))
    return best[1], best[2]


def rounds_taken(unit_tail: int, group_units: int, page_size: int, batch_rows: int,
                 cores: int) -> bool:
    """Whether whole units fold rounds (``with_rounds``): units with tails, several a loop
    iteration, on the blocked path (pages of at most 128 tokens), a bucket that loops over its
    units (not one unit, nor one a core on two)."""
    return bool(unit_tail and group_units > 1 and page_size <= 128 and batch_rows > 1
                and not (cores == 2 and batch_rows == 2))


def with_rounds(rows, spans, per: int, page_size: int, batch_rows: int, cores: int,
                untailed=None, slots: int = 0, lead: int = 0, lead_tail=()):
    """Whole units' rows with their loop iterations' rounds: each core's units sorted by the
    mask-free chunks that end at their tails (like units share iterations), then per group of
    ``unit_groups`` (``lead`` units' lead groups first) ROUNDS / ROUNDS1 (``group_rounds_of``)
    and each unit's ROUND_SLOT. With ``untailed`` (the rows before ``with_unit_tail``, same
    order) each group's tail starts are chosen with its rounds (``group_tails``), over
    ``slots`` tail slots, or a lead group's own (``lead_tail``: ``lead_tail_slots``) when
    set. A bucket of one unit, or of two on two cores, runs no loop over
    units: no rounds."""
    if batch_rows == 1 or (cores == 2 and batch_rows == 2):
        return rows
    per_chunk = chunk_tokens(page_size) // page_size
    leading = len(lead_groups(lead, per))
    for groups in unit_order(rows, spans, per, lead, untailed):
        for g in range(len(groups)):
            start, n = groups[g]
            if untailed is not None:
                tail = (lead_tail_of(lead_tail, g) if g < leading else 0) or slots
                fours, ones, starts = group_tails(untailed[start:start + n], tail)
                for k in range(n):
                    rows[start + k] = with_unit_tail(untailed[start + k], tail, page_size,
                                                     start=starts[k])
            else:
                fours, ones = group_rounds_of(rows[start:start + n])
            for row in rows[start:start + n]:
                row[ROUNDS], row[ROUNDS1] = fours, ones
                row[ROUND_SLOT] = row[SLOT0] + (row[C1] - ROUND_CHUNKS - row[C0]) * per_chunk
    return rows


def unit_order(rows, spans, per: int, lead: int, untailed=None) -> list:
    """Sorts each core's whole units ``rows`` (and ``untailed`` alike) in place by the mask-free
    chunks that end at their tails, most first, then by length, longest first (a lead group's
    tail sizes fall along it, ``tail_profile``); returns per core its ``unit_groups``."""
    groups = []
    for first, end in spans[:, :2]:
        first, end = int(first), int(end)
        order = sorted(range(first, end),
                       key=lambda k: (-_rounds_free(rows[k]), -int(rows[k][LEN])))
        rows[first:end] = [rows[k] for k in order]
        if untailed is not None:
            untailed[first:end] = [untailed[k] for k in order]
        groups.append(unit_groups(first, end, per, lead))
    return groups


def lead_tail_slots(rows, untailed, spans, per: int, lead: int, slots: int, sizes,
                    mode: str = "off", menu=(2, 4, 8)) -> tuple:
    """Tail slots of each lead group (``lead_groups``, every core's g-th; they hold the cores'
    longest units in order, ``unit_order``, and run without a device loop), 0 for the
    launch's ``slots``: of ``sizes`` (larger than ``slots``, up to ``unit_tail_chunks``), the
    one whose loop iterations and slots cost least over those groups' units, each position's
    slots as ``tail_profile`` (``mode``, ``menu``: its sizes) will shrink them, when it is
    larger than ``slots``. One static kernel argument for both cores (trailing zeros
    dropped): a launch whose long units would loop over their chunks before a tail of
    ``slots`` folds them in one longer tail instead (cost model, trn2, twelve chunks of 96
    queries over 100-1000 keys: three loop barriers fewer a core under LNC=2, 289.2 -> 261.0
    us, with the first group's alone)."""
    sizes = tuple(size for size in sizes if size > slots)
    leading = lead_groups(lead, per)
    if not (sizes and slots and leading):
        return ()
    rows, untailed = list(rows), list(untailed)
    groups = unit_order(rows, spans, per, lead, untailed)
    tails = []
    for g in range(len(leading)):
        positions = [[tuple(int(untailed[core[g][0] + k][c]) for c in (C0, FULL_LO, FULL_HI, C1))
                      for core in groups] for k in range(leading[g])]
        costs = {size: _profiled_tail_cost(positions, size, mode, menu)
                 for size in (slots,) + sizes}
        best = min(costs, key=lambda size: (costs[size] - 1e-9 * (size == slots), size))
        tails.append(best if best > slots else 0)
    while tails and not tails[-1]:
        tails.pop()
    return tuple(tails)


def _profiled_tail_cost(positions, size: int, mode: str, menu) -> float:
    """``unit_tail_slots``' cost of a group's units under tails of ``size`` slots (positions:
    per unit position, each core's (C0, FULL_LO, FULL_HI, C1)): their loop iterations, and
    each unit's empty slots and slots after ``tail_profile`` shrinks its position
    (``_position_fits``: to what the position's neediest unit takes)."""
    needs, own, loops = [], [], 0.0
    for units in positions:
        chunks = []
        for c0, lo, hi, c1 in units:
            cost, ts = unit_tail_cost(c0, lo, hi, c1, size)
            loops += cost - UNIT_TAIL_EMPTY_SLOT * (size - (c1 - ts))
            chunks.append(max(1, c1 - ts))
        needs.append(max(chunks + [1]))
        own.append(chunks)
    fits = _position_fits(needs, size, mode, menu)
    total = loops
    for fit, chunks in zip(fits, own):
        for need in chunks:
            total += UNIT_TAIL_EMPTY_SLOT * (fit - need) + UNIT_TAIL_SLOT * fit
    return total


# The "ladder" profile's steps below a lead group's size, in eighths of it (8 slots: 6, 4, 3),
# where they are whole tail sizes of two slots or more
LADDER_EIGHTHS = (6, 4, 3)
LADDER_SIZES = tuple(size for size in TAIL_SIZES if size >= 2)


def _position_fits(needs, top: int, mode: str, menu) -> list:
    """The tail slots ``tail_profile`` gives a body's unit positions that need ``needs`` chunks
    (at most ``top``): "exact" the least of TAIL_SIZES that fits, "lead" half of ``top`` where
    it fits and is in ``menu``, "ladder" the least of ``top`` and its LADDER_EIGHTHS that fits,
    both falling along the group, "off" ``top``."""
    if mode == "off":
        return [top] * len(needs)
    if mode == "exact":
        choices = [s for s in TAIL_SIZES if s <= top]
    elif mode == "ladder":
        choices = [top] + [top * k // 8 for k in LADDER_EIGHTHS
                           if top * k % 8 == 0 and top * k // 8 in LADDER_SIZES]
    else:
        choices = [s for s in (top // 2, top) if s == top or s in menu]
    fit = [min([s for s in choices if s >= min(top, want)] + [top]) for want in needs]
    if mode != "exact":
        for k in range(len(fit) - 2, -1, -1):
            fit[k] = max(fit[k], fit[k + 1])
    return fit


def lead_tail_of(lead_tails, g: int) -> int:
    """Lead group g's tail slots of ``lead_tail_slots``' tuple, 0 for the launch's."""
    return lead_tails[g] if g < len(lead_tails) else 0


def group_tails(rows, slots: int):
    """(ROUNDS, ROUNDS1, tail start of each unit) of a loop iteration's whole units ``rows``
    (before ``with_unit_tail``) chosen together: for each number of chunks the rounds could
    take from every unit, each unit's tail start ts in [max(C0, C1 - slots), C1] whose rounds'
    chunks [ts - taken, ts) are mask-free and whose own loops then cost least (with
    UNIT_TAIL_EMPTY_SLOT an empty slot); the taken count whose rounds plus the units' costs are
    least, the fewer rounds on ties. Units of unlike prefixes may so leave some tail slots
    empty to share the group's rounds instead of each running its own loop iteration."""
    bounds = [tuple(int(r[k]) for k in (C0, FULL_LO, FULL_HI, C1)) for r in rows]
    most = min(min(hi, c1) - lo for c0, lo, hi, c1 in bounds)    # rounds within every unit
    best = None
    for taken in range(max(0, min(most, ROUNDS_MAX * ROUND_CHUNKS + ROUNDS1_MAX)) + 1):
        fours = min(ROUNDS_MAX, taken // ROUND_CHUNKS)
        ones = taken - fours * ROUND_CHUNKS          # at most ROUNDS1_MAX (the range's bound)
        cost, starts = float(fours + ones), []
        for c0, lo, hi, c1 in bounds:
            unit = unit_tail_cost(c0, lo, hi, c1, slots, taken=taken)
            if unit is None:
                break
            cost += unit[0]
            starts.append(unit[1])
        else:
            if best is None or cost < best[0] - 1e-9:
                best = (cost, fours, ones, starts)
    return best[1], best[2], best[3]


def with_unit_tail(row: np.ndarray, slots: int, page_size: int,
                   rounds: bool = False, start: int = None) -> np.ndarray:
    """A whole unit's row whose chunks from ts on are its tail, ts in [max(C0, C1 - slots), C1]
    the start that leaves its loops the fewest iterations (an empty slot UNIT_TAIL_EMPTY_SLOT
    of one; ties to the later start): C1 := ts (the unit's loops end there, the kernel folds
    ``slots`` chunks from ts), the window-start range [C0, FULL_LO) and the mask-free range
    clipped to end by ts, and LEN to the unit's chunks (a split unit's first part: its tail's
    slots past them read nothing). ``start``: ts as the caller chose it (``group_tails``)."""
    if not slots:
        return row
    row = row.copy()
    c0, lo, hi, c1 = (int(row[k]) for k in (C0, FULL_LO, FULL_HI, C1))
    ts = unit_tail_cost(c0, lo, hi, c1, slots, rounds)[1] if start is None else start
    lo = min(lo, ts)
    row[FULL_LO], row[FULL_HI], row[C1] = lo, max(lo, min(hi, ts)), ts
    row[LEN] = min(int(row[LEN]), c1 * chunk_tokens(page_size))
    return row


# SBUF per partition an iteration's items may hold in query stationaries (each item prepares its
# queries before any item's chunks): verification of 16 drafts at GQA 16 with an fp32 cache and
# head_dim 256 holds 8 KiB an item, and 16 items overflowed SBUF (4 an iteration now); a
# Llama-3-8B item holds 256 B (decode) to 512 B (8 drafts).
ITERATION_QUERY_BYTES = 32 * 1024


def item_query_bytes(q_heads: int, q_block: int, head_dim: int, mm_bytes: int) -> int:
    """Bytes per partition of a flat-list item's query stationaries: its q_heads x q_block rows
    of head_dim (in pieces of 128 partitions) in the matmul dtype."""
    return -(-head_dim // 128) * q_heads * q_block * mm_bytes


def items_per_iteration(q_block: int, query_bytes: int = 0) -> int:
    """Items per iteration of the flat list's loops (a power of two): DECODE_ITEMS_PER_ITERATION
    for decode and verification items whatever the bucket (a lone long request's blocks are
    several items too; the remainder of each kind runs in narrower loops, so nothing is
    padded), halved (down to 2) while their queries (``query_bytes`` each,
    ``item_query_bytes``) exceed ITERATION_QUERY_BYTES; whole units take an iteration each."""
    if whole_units(q_block):
        return 1
    per = DECODE_ITEMS_PER_ITERATION
    while per > 2 and per * query_bytes > ITERATION_QUERY_BYTES:
        per //= 2
    return per


def _core_loops(span_row, per_iteration: int) -> list:
    """[(first, end, width)] of one core's loops in the kernel's order (kinds in ITEM_CLASSES
    order, each kind's loops widest first), from the core's span row."""
    if len(span_row) != span_cols(per_iteration):
        raise ValueError(f"a span row of {len(span_row)} columns is not one of per_iteration="
                         f"{per_iteration} ({span_cols(per_iteration)} columns)")
    loops = []
    for kind in range(len(ITEM_CLASSES)):
        for width in loop_widths(per_iteration):
            col = span_column(kind, width, per_iteration)
            loops.append((int(span_row[col]), int(span_row[col + 1]), width))
    return loops


def core_rows(span_row, per_iteration: int) -> list:
    """Rows of the work-item table one core runs, in the kernel's order (``_core_loops``)."""
    rows = []
    for first, end, _ in _core_loops(span_row, per_iteration):
        rows.extend(range(first, end))
    return rows


def iteration_starts(span_row, per_iteration: int) -> list:
    """First rows of one core's loop iterations, in the order the kernel runs them
    (``_core_loops``). Each iteration's first row holds the next one's (NEXT; the last, row
    0's: a load nobody reads) and the span row the first (START), so an iteration's rows are
    loaded while the one before it runs."""
    starts = []
    for first, end, width in _core_loops(span_row, per_iteration):
        starts.extend(range(first, end, width))
    return starts


# ``tails`` of the flat list (``class_items``): False (none), True (a unit's chunks past its
# whole blocks of TAIL_CHUNKS: verification) or LATE_TAILS (decode: a unit's last TAIL_CHUNKS
# chunks when only the last of them is masked, so the kernel zeroes one V slot of the tail,
# ``kernel_items.late_tail``, as a unit's single masked chunk costs without tails)
LATE_TAILS = "late"


def class_items(full_lo, full_hi, a, e, tails=False):
    """[(kind, first chunk, end chunk)] of a unit's chunks [a, e) with mask-free range
    [full_lo, full_hi): each masked chunk alone (the first of kind 1, later ones MASKED_AGAIN),
    the mask-free ones in CHUNK_BLOCKS (all the 32-blocks that fit, then at most one of each
    smaller size); kinds index ITEM_CLASSES. ``tails``: the chunks past the mask-free range's
    whole blocks of TAIL_CHUNKS are one TAIL item (its first TAIL_CHUNKS; masked chunks past
    those alone), the masked chunks before the range (a window's start) alone, the first of
    them of kind 1 only when there is no tail; LATE_TAILS: ``_late_tail_items``."""
    if tails == LATE_TAILS:
        return _late_tail_items(full_lo, full_hi, a, e)
    if tails:
        return _tail_items(full_lo, full_hi, a, e)
    out = []
    for c in range(a, e):
        if not full_lo <= c < full_hi:
            out.append((1 if not out else MASKED_AGAIN, c, c + 1))
    return out + _blocks(max(a, full_lo), min(e, full_hi))


def _blocks(lo, hi):
    """[(kind, first, end)] of the mask-free chunks [lo, hi) in CHUNK_BLOCKS: all the 32-blocks
    that fit, then at most one of each smaller size."""
    out = []
    for kind, (size, masked) in enumerate(ITEM_CLASSES):
        if size and not masked:
            while hi - lo >= size:
                out.append((kind, lo, lo + size))
                lo += size
    return out


def _tail_items(full_lo, full_hi, a, e):
    """``class_items`` with tails."""
    lo = min(max(a, full_lo), e)
    hi = max(min(e, full_hi), lo)
    x = lo + (hi - lo) // TAIL_CHUNKS * TAIL_CHUNKS
    out = []
    if x < e:
        out.append((TAIL, x, min(e, x + TAIL_CHUNKS)))
    for c in range(a, lo):
        out.append((FIRST_MASKED if not out else MASKED_AGAIN, c, c + 1))
    for c in range(x + TAIL_CHUNKS, e):
        out.append((MASKED_AGAIN, c, c + 1))
    return out + _blocks(lo, x)


def _late_tail(full_lo, full_hi, a, e):
    """Whether chunks [a, e) end in a late tail: at least TAIL_CHUNKS chunks whose last one is
    the only masked chunk among the last TAIL_CHUNKS (arrays of cuts, or ints)."""
    x = e - TAIL_CHUNKS
    return (x >= a) & (full_lo <= x) & (full_hi == e - 1)


def _late_tail_items(full_lo, full_hi, a, e):
    """``class_items`` with LATE_TAILS: a unit whose chunks [a, e) end in one masked chunk after
    TAIL_CHUNKS - 1 mask-free ones or more has its last TAIL_CHUNKS chunks as one TAIL item (the
    unit's first: TAIL runs before MASKED_AGAIN), its masked chunks before the mask-free range
    (a window's start) MASKED_AGAIN, the mask-free ones before the tail in blocks, unless that
    makes more items than without tails (9 chunks: a tail and blocks of 4 and 1, against a
    masked chunk and a block of 8); any other unit as without tails."""
    plain = class_items(full_lo, full_hi, a, e)
    if not _late_tail(full_lo, full_hi, a, e):
        return plain
    x = e - TAIL_CHUNKS
    late = [(TAIL, x, e)]
    for c in range(a, min(full_lo, x)):
        late.append((MASKED_AGAIN, c, c + 1))
    late += _blocks(max(a, full_lo), x)
    return late if len(late) <= len(plain) else plain


def _late_tail_counts(full_lo, full_hi, a, e):
    """``_kind_counts`` with LATE_TAILS."""
    plain = _kind_counts(full_lo, full_hi, a, e)
    x = e - TAIL_CHUNKS
    late = np.zeros_like(plain)
    late[..., TAIL] = 1
    late[..., MASKED_AGAIN] = np.maximum(0, np.minimum(full_lo, x) - a)
    late = _block_counts(late, np.maximum(0, x - np.maximum(a, full_lo)))
    take = _late_tail(full_lo, full_hi, a, e) & (late.sum(axis=-1) <= plain.sum(axis=-1))
    return np.where(take[..., None], late, plain)


def _kind_counts(full_lo, full_hi, a, e, tails=False):
    """[..., kinds] items of each ITEM_CLASSES kind ``class_items`` makes of chunks [a, e)
    (arrays of cuts), counted without listing; an empty range has none."""
    a, e = np.asarray(a, np.int64), np.asarray(e, np.int64)
    if tails == LATE_TAILS:
        return _late_tail_counts(full_lo, full_hi, a, e)
    if tails:
        return _tail_counts(full_lo, full_hi, a, e)
    free = np.maximum(0, np.minimum(e, full_hi) - np.maximum(a, full_lo))
    out = np.zeros(np.broadcast(a, e).shape + (len(ITEM_CLASSES),), np.int64)
    masked = (np.clip(full_lo, a, e) - a) + (e - np.clip(full_hi, a, e))
    out[..., 1] = np.minimum(masked, 1)
    out[..., MASKED_AGAIN] = masked - out[..., 1]
    return _block_counts(out, free)


def _block_counts(out, free):
    """``out`` [..., kinds] with the counts of ``_blocks`` of ``free`` mask-free chunks set."""
    big = CHUNK_BLOCKS[0]
    for kind, (size, masked) in enumerate(ITEM_CLASSES):
        if size and not masked:
            out[..., kind] = free // big if size == big else (free % big) // size % 2
    return out


def _tail_counts(full_lo, full_hi, a, e):
    """``_kind_counts`` with tails."""
    lo = np.minimum(np.maximum(a, full_lo), e)
    hi = np.maximum(np.minimum(e, full_hi), lo)
    free = (hi - lo) // TAIL_CHUNKS * TAIL_CHUNKS
    rest = e - lo - free                           # chunks of the tail and past it
    out = np.zeros(np.broadcast(a, e, lo).shape + (len(ITEM_CLASSES),), np.int64)
    out[..., TAIL] = rest > 0
    head = lo - a
    out[..., FIRST_MASKED] = (head > 0) & (rest == 0)
    out[..., MASKED_AGAIN] = head - out[..., FIRST_MASKED] + np.maximum(0, rest - TAIL_CHUNKS)
    return _block_counts(out, free)


def _part_items(full_lo, full_hi, a, e, tails=False):
    """Items ``class_items`` makes of chunks [a, e) (arrays of cuts), counted without listing."""
    return _kind_counts(full_lo, full_hi, a, e, tails).sum(axis=-1)


def loop_iterations(counts, per_iteration: int):
    """Loop iterations a core runs for ``counts`` [..., kinds] items of each kind: per kind,
    whole iterations of ``per_iteration`` items, then one of each width the remainder needs."""
    counts = np.asarray(counts, np.int64)
    rest = counts % per_iteration
    bits = sum((rest >> k) & 1 for k in range(max(1, per_iteration.bit_length())))
    return (counts // per_iteration + bits).sum(axis=-1)


def decode_work(kv_indptr, kv_lens, window_left: int, page_size: int, batch_rows: int,
                cores: int = 1, per_iteration: int = None, capacity: int = None,
                null: NullItems = None, tails: bool = False) -> DecodeWork:
    """Share a decode step between ``cores`` (1, or 2 under LNC=2) program instances.

    Two cores: requests keep their order and the sequence of all their chunks is cut in two
    halves of equal modelled work: core 0 takes the requests before the cut, core 1 those after
    it, and the request the cut falls in is split at a chunk boundary (split-KV), so one long
    request uses both cores as evenly as many short ones. ``capacity``: chunks the page table can
    hold (sets the table's static row count; default: what these requests need); ``null``,
    ``tails``: see ``split_work``.
    """
    if per_iteration is None:
        per_iteration = items_per_iteration(1)
    return split_work(_requests(kv_indptr, kv_lens, window_left, page_size), page_size, batch_rows,
                      cores, per_iteration, capacity, null=null, tails=tails)


# A static pass: a small bucket runs without device loops, each row one masked item of a
# number of chunks (STATIC_CHUNK_COUNTS) covering its request (the chunks past its keys read
# nothing): no loop barrier (~9 us) and no pipeline fill per kind of item, at the price of one
# compile per chunk count and compute on the padding. Taken when its modelled cost (per row a
# core runs and per chunk slot, chunk-equivalents fitted to the schedule on trn2, LNC=1 and 2:
# 238 steps of 1-32 requests (12 and 24 among them) of 128-4096 keys, uniform, spread 8x and
# within a fifth, each run both ways, ``benchmarks/static_policy.py``: 316 steps with up to
# 256 slots; the picks cost 29025 us against the 28758 of the better of each, 29150 with the
# slot at 1.3 before static passes zeroed V in their full slots only; 1.0 fits the grid best,
# 28873, but took steps of the serving replays static that ran faster looped: LNC=1 395.3 ->
# 398.9 us a step)
# is below the loops' (``_core_load``), for at most STATIC_MAX_SLOTS chunk slots (the program
# holds every one: 256 of them, 32 rows of 8 chunks or 8 of 32, took ~6,400 instructions, as
# many as the loops' 5,800; packed four requests a tile, ``static_pack``, 512 slots take about
# as many) and STATIC_MAX_ROW_BYTES of SBUF for the rows. Packed, the policy takes every
# short-context step of the grid static: the loops cost 1.3-3.2x more there (trn2, Llama-3-8B:
# 48 x 200-700 keys 341 us against 533, 32 x 64-2048 511 against 710, LNC=2 176 against 283
# and 256 against 401).
STATIC_MAX_CHUNKS = 32
STATIC_MAX_SLOTS = 512
# A static row's chunk counts: 1-4, then twice and three times the powers of two from 2 (6, 8,
# 12, ...), so a row folds a divisor of its count per softmax step (at most 4: one PSUM bank
# of scores) and pads at most a third of its slots (with powers of two only, 8 x 400-700 keys
# padded 6 chunks to 8: 125.2 -> 99.2 us)
STATIC_CHUNK_COUNTS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32)
STATIC_FIXED_COST_CHUNKS = 0.0
SPLIT_MERGE_COST_CHUNKS = 5.0          # LNC=2 loops: the split unit's sendrecv and merge
STATIC_SPLIT_COST_CHUNKS = 2.0         # a static pass split between two cores: its exchange
STATIC_ROW_COST_CHUNKS = 2.25
STATIC_SLOT_COST_CHUNKS = 1.15
PACKED_SLOT_SHARE = 0.5                # of a slot's cost, what packed requests share (assumed)


# A static pass folds 4 chunks a softmax step with its gathers two steps ahead: K and V of a
# chunk (bytes per partition) beyond this make its pipeline overflow SBUF (fp32, 16 kv heads of
# 128: 16 KiB), so such caches run the loops
STATIC_MAX_CHUNK_BYTES = 8 * 1024
# SBUF per partition a core's static rows may hold in query stationaries and mask predicates
# (each row keeps its own, beside the first gathers' STATIC_UPFRONT_BYTES: 32 rows of GQA 16 at
# head_dim 256 in bf16, 128 KiB of stationaries, overflowed SBUF, as did 16 rows of 16 chunks
# there, and 32 of 8 chunks at GQA 8; Llama-3-8B's 32 rows of 8 chunks take 48 KiB)
STATIC_MAX_ROW_BYTES = 64 * 1024


def static_row_bytes(kv_heads: int, group: int, head_dim: int, mm_bytes: int,
                     q_block: int = 1) -> int:
    """Bytes per partition one row (``q_block`` queries: 1 for decode) keeps for a whole static
    pass: its query rows, one [rows, head_dim] tile per tile of score rows (``score_tiling``;
    its zero-padded stationaries come from a pool of a few and its mask is made a few rows
    ahead, ``kernel.static_prep``)."""
    tiles = score_tiling(kv_heads, group, q_block)[2]
    return tiles * head_dim * mm_bytes


def static_pass(req: _Requests, page_size: int, batch_rows: int, cores: int = 1,
                nc_version: int = 3, chunk_bytes: int = 0, row_bytes: int = 0,
                pack: int = 1) -> int:
    """Chunks per item of a static pass over items of one tile of query rows ``req``
    (``query_blocks`` of q_block 1, a decode step, or a verification step's drafts), or 0 when
    the step runs device loops: a bucket too large or
    cheaper looped (``cores``: under LNC=2 each core takes half the rows, or half the chunk
    slots of a bucket of one, ``static_split``; the loops half the work), or no block of masked
    chunks to gather at once (NeuronCore-v2: no indirect DMA; pages over 128 tokens), or a
    chunk's K and V (``chunk_bytes`` per partition) past STATIC_MAX_CHUNK_BYTES, or a core's rows'
    queries (``row_bytes`` a row, ``static_row_bytes``) and cache rows (4 bytes a chunk slot)
    past STATIC_MAX_ROW_BYTES, or, under LNC=2, an odd bucket of several rows (the cores take
    equal halves: a bucket policy of growth 1.5 makes buckets of 3 or 9). ``pack``: requests
    a tile of score rows (``static_pack``), whose fixed costs they share."""
    if nc_version < 3 or page_size > 128 or chunk_bytes > STATIC_MAX_CHUNK_BYTES:
        return 0
    if cores == 2 and batch_rows > 1 and batch_rows % 2:
        return 0
    looped, rows, chunks, split = static_terms(req, batch_rows, cores)
    if (chunks > STATIC_MAX_CHUNKS or chunks * batch_rows > STATIC_MAX_SLOTS
            or rows * (row_bytes + 4 * chunks) > STATIC_MAX_ROW_BYTES):
        return 0
    # a pass not split runs in sections (``static_sections``) when they cost less
    cost = (static_cost(rows, chunks, split, pack=pack) if split else
            _static_sections(req, batch_rows, cores, chunks, pack)[0])
    return chunks if cost < looped else 0


def static_terms(req: _Requests, batch_rows: int, cores: int = 1):
    """What ``static_pass`` weighs, in chunk-equivalents: (the loops' cost, rows a core runs
    statically, chunks a row, whether a bucket of one is split between two cores)."""
    chunks_of = (req.c1 - req.c0).astype(np.int64)
    split = static_split(batch_rows, cores)
    chunks = static_chunk_count(-(-int(chunks_of.max(initial=0)) // (2 if split else 1)))
    kinds = _unit_items(req)[1].sum(axis=0)
    U = items_per_iteration(1)
    barriers = loop_iterations(padded_counts(kinds, U), U) * ITERATION_COST_CHUNKS
    # under LNC=2 the loops' work halves, each core's loop barriers stay, and the unit cut
    # between the cores is exchanged and merged
    looped = (_core_load(chunks_of.sum(), kinds, U, pad=True) - barriers) / cores + barriers
    if cores == 2:
        looped += SPLIT_MERGE_COST_CHUNKS
    return looped, static_core_rows(batch_rows, cores), chunks, split


def static_cost(rows: int, chunks: int, split: bool, row_cost: float = None,
                slot_cost: float = None, pack: int = 1,
                slot_share: float = PACKED_SLOT_SHARE) -> float:
    """A static pass's cost of ``rows`` rows of ``chunks`` chunks a core (chunk-equivalents;
    STATIC_ROW_COST_CHUNKS and STATIC_SLOT_COST_CHUNKS unless given), the two halves' exchange
    and merge added when ``split``; ``pack`` requests a tile share a row's cost and
    ``slot_share`` of a slot's (the softmax; each has its own gathers)."""
    row_cost = STATIC_ROW_COST_CHUNKS if row_cost is None else row_cost
    slot_cost = STATIC_SLOT_COST_CHUNKS if slot_cost is None else slot_cost
    if pack > 1:
        row_cost /= pack
        slot_cost *= 1 - slot_share * (1 - 1 / pack)
    static = STATIC_FIXED_COST_CHUNKS + rows * (row_cost + chunks * slot_cost)
    return static + (STATIC_SPLIT_COST_CHUNKS if split else 0.0)


# A static pass in sections: per core, its rows of the longest requests take the pass's chunk
# count and its other rows fewer, section by section (a spread batch, or a bucket with empty
# rows, pads fewer slots). At most STATIC_MAX_SECTIONS. The split is the one whose
# ``static_cost`` is least with packed requests sharing SECTION_SLOT_SHARE of a slot's cost and
# STATIC_SECTION_COST_CHUNKS a further section (fitted on the 120 decode launches of four
# replays, trn2, every split of the menu modelled: these took 1.0015x the best split's time,
# PACKED_SLOT_SHARE and no section cost 1.012x); whether the pass beats the loops is weighed
# as before, with PACKED_SLOT_SHARE and no section cost (with the fitted terms, 2 of 600
# random decode launches flipped to loops, 23-27% slower). Sections are static arguments,
# taken from a fixed menu (STATIC_SECTION_TEMPLATES; ``NKI_KERNELS_STATIC_SECTIONS``,
# ``buckets.static_sections_mode``: 1 keeps one section, ``any`` weighs every split)
STATIC_MAX_SECTIONS = 3
SECTION_SLOT_SHARE = 0.0
STATIC_SECTION_COST_CHUNKS = 2.0


def static_sections(req: _Requests, batch_rows: int, cores: int, chunks: int,
                    pack: int = 1) -> tuple:
    """The sections of a static pass of ``chunks`` chunks a row, as ((rows a core, chunks a
    row), ...) from the longest requests' (``chunks``) down, or () for one section: the split
    of each core's rows whose ``static_cost`` (packing ``section_pack`` requests a tile that
    share SECTION_SLOT_SHARE of a slot, plus STATIC_SECTION_COST_CHUNKS a further section) is
    least; () too for a bucket of one split between the cores. ``pack``: the requests a tile of
    one section (``static_pack``)."""
    if static_split(batch_rows, cores):
        return ()
    return _static_sections(req, batch_rows, cores, chunks, pack)[1]


def _static_sections(req: _Requests, batch_rows: int, cores: int, chunks: int, pack: int):
    """(cost, sections): the least cost of a split (chunk-equivalents; PACKED_SLOT_SHARE, no
    cost a section: what ``static_pass`` weighs against the loops), and the sections of
    ``static_sections`` (not split)."""
    least = best = pick = None
    for sizes, counts in section_options(req, batch_rows, cores, chunks, pack):
        weigh = split_cost(sizes, counts, pack, PACKED_SLOT_SHARE, 0.0)
        choose = split_cost(sizes, counts, pack, SECTION_SLOT_SHARE, STATIC_SECTION_COST_CHUNKS)
        least = weigh if least is None else min(least, weigh)
        if best is None or choose < best:
            best, pick = choose, (tuple(zip(sizes, counts)) if len(sizes) > 1 else ())
    return least, pick


def section_options(req: _Requests, batch_rows: int, cores: int, chunks: int, pack: int):
    """The splits a static pass of ``chunks`` chunks a row weighs, as (rows a core, chunk
    counts) per section, one section first (``_section_choices``)."""
    half = static_core_rows(batch_rows, cores)
    longest = np.sort((req.c1 - req.c0).astype(np.int64))[::-1]

    def count_from(row):               # chunks of a section whose first row a core is ``row``
        return static_chunk_count(int(longest[cores * row:].max(initial=0)) or 1)

    yield (half,), (chunks,)
    for cuts, counts in _section_choices(longest, half, cores, chunks, pack, count_from):
        bounds = (0,) + cuts + (half,)
        yield tuple(b - a for a, b in zip(bounds, bounds[1:])), tuple(counts)


def split_cost(sizes, counts, pack: int, slot_share: float, section_cost: float,
               row_cost: float = None) -> float:
    """``static_cost`` of a split (rows a core and chunk counts per section; packing
    ``section_pack`` requests a tile that share ``slot_share`` of a slot), the fixed cost paid
    once and ``section_cost`` a further section."""
    packed = section_pack(pack, sizes)
    return (sum(static_cost(n, c, False, row_cost=row_cost, pack=packed, slot_share=slot_share)
                for n, c in zip(sizes, counts))
            + (len(sizes) - 1) * (section_cost - STATIC_FIXED_COST_CHUNKS))


# The splits a static pass in sections takes: each template lists where its further sections
# start, as a fraction of a core's rows (at least row 1), and their chunk count: the pass's
# divided by the number given, or by any of a tuple of them, rounded up to a
# STATIC_CHUNK_COUNTS entry (0: one chunk, as a bucket's empty rows need). A section's rows and
# chunk count are static arguments, so a fixed menu of fixed counts bounds the programs a
# bucket compiles whatever lengths it meets (``static_pass_menu``: at most 32 a chunk count).
# Chosen in the cost model (trn2, LNC=1 / LNC=2) against a menu whose later sections took any
# smaller count (at most 94 programs a chunk count): the same splits on 116 of 120 decode
# launches of the chunked-prefill (64, 128) and unchunked replays. With the split chosen as
# ``static_sections`` does (``benchmarks/decode_sections.py``): twelve spread batches of 3-40
# requests of 50-4096 keys 1.001x / 1.004x the old menu's time, three of one ~4000-key request
# among short ones 0.89x / 1.02x; a random-mix serving loop (5-7 requests of 100-900 keys a
# step) plans 16 / 9 decode programs in 120 steps (the old menu and terms 12 / 8). The eighths
# serve one long request among short ones, the zeros a bucket's empty rows.
STATIC_SECTION_TEMPLATES = (
    ((1 / 2, 2), (3 / 4, 4)),
    ((3 / 4, (2, 3, 4)),),
    ((3 / 4, 0),),
    ((1 / 2, (2, 3, 4)),),
    ((1 / 4, 2), (3 / 4, 0)),
    ((1 / 2, (2, 3, 4, 8)), (3 / 4, 0)),
    ((1 / 8, 8),),
    ((1 / 8, 8), (3 / 4, 0)),
)


def _section_choices(longest, rows: int, cores: int, chunks: int, pack: int, count_from):
    """The splits ``_static_sections`` weighs, as (cut rows, chunk counts): the
    STATIC_SECTION_TEMPLATES whose sections hold their requests (``count_from(row)``: the
    chunk count the longest request from a core's ``row`` on needs) and that keep distinct cuts
    in a core's ``rows``, or, with ``NKI_KERNELS_STATIC_SECTIONS=any``, every split
    ``_section_cuts`` finds worth weighing."""
    limit, any_split = static_sections_mode(STATIC_MAX_SECTIONS)
    if any_split:
        for cuts in _section_cuts(longest, rows, cores, chunks, pack):
            counts = [chunks] + [count_from(c) for c in cuts]
            if all(b < a for a, b in zip(counts, counts[1:])):
                yield cuts, counts
        return
    for cuts, counts in _template_splits(rows, chunks, limit):
        if all(count_from(c) <= n for c, n in zip(cuts, counts[1:])):
            yield cuts, counts


def _template_splits(rows: int, chunks: int, limit: int):
    """(cut rows, chunk counts) of each STATIC_SECTION_TEMPLATES entry of fewer than ``limit``
    further sections over a core's ``rows`` and a pass of ``chunks``: distinct cuts inside the
    rows, chunk counts falling section by section (others are skipped)."""
    for template in STATIC_SECTION_TEMPLATES:
        if len(template) >= limit:
            continue
        cuts = tuple(max(1, int(rows * start)) for start, _ in template)
        if not all(0 < c < rows for c in cuts) or len(set(cuts)) < len(cuts):
            continue
        for later in itertools.product(*(_section_counts(chunks, d) for _, d in template)):
            counts = [chunks] + list(later)
            if all(b < a for a, b in zip(counts, counts[1:])):
                yield cuts, counts


def _section_counts(chunks: int, divisors) -> tuple:
    """The chunk counts a template's section may take in a pass of ``chunks``: the pass's over
    each of ``divisors`` (one number or a tuple) rounded up to a STATIC_CHUNK_COUNTS entry, 1
    for 0."""
    counts = []
    for d in (divisors if isinstance(divisors, tuple) else (divisors,)):
        counts.append(1 if d == 0 else static_chunk_count(-(-chunks // d)))
    return tuple(dict.fromkeys(counts))


def static_pass_menu(batch_rows: int, cores: int, chunks: int) -> tuple:
    """Every static-pass argument (``plan.STATIC_PASS``) a decode bucket of ``batch_rows``
    rows on ``cores`` cores can take for a pass of ``chunks`` chunks a row, under the default
    sections (``NKI_KERNELS_STATIC_SECTIONS`` unset or a number; ``any`` goes past it): one
    section, (chunks, full slots), full slots 0 or ``chunks`` (``static_full_slots``), and each
    template split (``STATIC_SECTION_TEMPLATES``), (chunks, full, ((rows a core, chunks, full
    slots), ...)), the first section's full slots 0 or ``chunks``, the others' 0. A bucket
    compiles once per value met, so at most this many programs a chunk count (warm-up: launch
    each)."""
    menu = [(chunks, 0), (chunks, chunks)]
    if static_split(batch_rows, cores):
        return tuple(menu)
    half = static_core_rows(batch_rows, cores)
    limit = static_sections_mode(STATIC_MAX_SECTIONS)[0]
    for cuts, counts in _template_splits(half, chunks, limit):
        sizes = [b - a for a, b in zip((0,) + cuts, cuts + (half,))]
        for full in (0, chunks):
            menu.append((chunks, full, section_parts(tuple(zip(sizes, counts)), full)))
    return tuple(dict.fromkeys(menu))


def section_parts(sections, full: int) -> tuple:
    """A static pass's sections ((rows a core, chunks), ...) as its static argument has them,
    ((rows a core, chunks, full slots), ...): the first section's full slots ``full``
    (``static_full_slots`` of its requests), the others' 0 (their requests' lengths differ, and
    each value would be another program)."""
    return (tuple(sections[0]) + (full,),) + tuple(tuple(s) + (0,) for s in sections[1:])


def _section_cuts(longest, rows: int, cores: int, chunks: int, pack: int):
    """The increasing tuples of 1 to STATIC_MAX_SECTIONS - 1 cut points in (0, ``rows``) worth
    weighing: where a section of a smaller chunk count can start (the first row a core past
    every request longer than it: ``longest`` is the requests' chunks, longest first), or that
    row rounded up to a multiple of 2, 4, .. ``pack`` (a section of whole packed tiles)."""
    starts = set()
    for count in STATIC_CHUNK_COUNTS:
        if count < chunks:
            first = -(-int((longest > count).sum()) // cores)
            size = 1
            while size <= pack:
                starts.add(-(-first // size) * size)
                size *= 2
    starts = sorted(r for r in starts if 0 < r < rows)
    out = []
    for k in range(1, static_sections_mode(STATIC_MAX_SECTIONS)[0]):
        out.extend(itertools.combinations(starts, k))
    return out


def section_pack(pack: int, sizes) -> int:
    """Requests a tile of a static pass in sections packs: ``pack`` (one section's,
    ``static_pack``) or the largest power of two below it that divides every section's rows."""
    for n in sizes:
        while n % pack:
            pack //= 2
    return pack


def static_row_chunks(batch_rows: int, cores: int, chunks: int, sections=()) -> np.ndarray:
    """[batch_rows] chunk slots of each row of a static pass: ``chunks``, or in sections
    (``static_sections``) core p's row p * half + k its section's."""
    counts = np.full(batch_rows, chunks, np.int64)
    if sections:
        half = static_core_rows(batch_rows, cores)
        k = np.arange(batch_rows) % half
        first = 0
        for rows, count in sections:
            counts[(k >= first) & (k < first + rows)] = count
            first += rows
    return counts


def static_chunk_count(chunks: int) -> int:
    """The STATIC_CHUNK_COUNTS entry a static row of ``chunks`` chunks is padded to (the
    smallest that holds them), or a number past STATIC_MAX_CHUNKS when none does."""
    for count in STATIC_CHUNK_COUNTS:
        if count >= chunks:
            return count
    return STATIC_MAX_CHUNKS + 1


def static_split(batch_rows: int, cores: int) -> bool:
    """Whether a static pass splits its one row between two cores (LNC=2, a bucket of one
    request: core p folds chunk slots [p, p + 1) x chunks of it, the halves' states merged),
    rather than leave the second core idle."""
    return cores == 2 and batch_rows == 1


def static_full_slots(req: _Requests, page_size: int, batch_rows: int, chunks: int,
                      cores: int = 1, members=None) -> int:
    """Leading chunk slots of a static pass (``static_work``'s rows of ``chunks`` slots) whose
    every token is a key of its row, in every row that has keys: their gathers skip no row, so
    their V tiles need no zeroing (``kernel_items.loader``). Rows past the batch read nothing
    and write rows the launch drops: they do not count. A row with no keys gives 0 (its
    output must be 0 from zeroed V rows). A static argument, so all or none: ``chunks`` when
    every slot is full, else 0 (rounding down to any STATIC_CHUNK_COUNTS entry, a program
    each, was 0.7% faster on spread batches). ``members``: the requests of one section of the
    pass (``static_sections``), else all."""
    T = chunk_tokens(page_size)
    split = static_split(batch_rows, cores)
    for b in (range(req.L.size) if members is None else members):
        for p in range(2 if split else 1):
            a = int(req.c0[b]) + p * chunks          # the row's slots: chunks a .. a + chunks
            if a * T < int(req.W[b]) or (a + chunks) * T > int(req.L[b]):
                return 0
    return chunks


def static_core_rows(batch_rows: int, cores: int = 1) -> int:
    """Rows each core runs in a static pass over a bucket of ``batch_rows``: half of them
    under LNC=2 (``static_pass`` takes no odd bucket there), one each for a split bucket of one
    (``static_split``), else all."""
    return batch_rows // cores if batch_rows > 1 else 1


# SBUF per partition of one packed item's zero-padded query stationaries (pack x kv heads of
# them, each [D, kv heads x group] in the matmul dtype; a pool of a few is kept)
STATIC_PACK_PAD_BYTES = 8 * 1024


def static_pack(core_rows: int, kv_heads: int, group: int, mm_bytes: int = 2) -> int:
    """Requests of a decode static pass that share one tile of score rows: the largest power of
    two whose rows fit 128 partitions, whose stationaries fit STATIC_PACK_PAD_BYTES and that
    divides the rows a core runs (``static_core_rows``); 1 for a split bucket, or when a
    request's rows (kv heads x group) are not a multiple of 32 (each request's scores are
    matmul outputs at its own partition offset, which must be 0, 32, 64 or 96: no product
    crosses requests). Packed, a tile's softmax, evictions and output write serve several
    requests at once (a Llama-3-8B request fills 32 partitions)."""
    rows = kv_heads * group
    pack = 1
    while (rows % 32 == 0 and 2 * pack * rows <= 128 and core_rows % (2 * pack) == 0
           and 2 * pack * kv_heads * rows * mm_bytes <= STATIC_PACK_PAD_BYTES):
        pack *= 2
    return pack


def static_rows_of(req: _Requests, batch_rows: int, cores: int = 1,
                   sections=()) -> np.ndarray:
    """[B] the static pass's table row of each request (``static_work``): request b at row b on
    one core (and for a split bucket of one); under LNC=2, where core p takes rows
    [p * half, (p + 1) * half), the requests are dealt to the two halves so their chunks
    balance (longest first, each to the half with fewer chunks and a free row), in request order
    within a half: a spread batch in request order put its long requests on one core (4 x
    100-800 keys: 1,366 keys on one core, 433 on the other). In sections
    (``static_sections``): each section's rows on the cores take the next longest requests,
    dealt the same way."""
    B = req.L.size
    if (cores != 2 or batch_rows < 2) and not sections or B == 0:
        return np.arange(B, dtype=np.int64)
    half = static_core_rows(batch_rows, cores)
    chunks = (req.c1 - req.c0).astype(np.int64)
    ranked = sorted(range(B), key=lambda b: (-int(chunks[b]), b))
    rows = np.zeros(B, np.int64)
    parts, first = [], 0
    for size, _ in sections or ((half, 0),):
        parts.append((first, ranked[cores * first:cores * (first + size)], size))
        first += size
    for first, section, size in parts:
        load, members = [0] * cores, [[] for _ in range(cores)]
        for b in section:
            open_cores = [p for p in range(cores) if len(members[p]) < size]
            p = min(open_cores, key=lambda p: (load[p], p))
            members[p].append(b)
            load[p] += int(chunks[b])
        for p in range(cores):
            for k, b in enumerate(sorted(members[p])):
                rows[b] = p * half + first + k
    return rows


def static_work(req: _Requests, page_size: int, batch_rows: int, chunks: int,
                null: NullItems, cores: int = 1, rows: np.ndarray = None,
                sections=(), q_block: int = 1) -> DecodeWork:
    """The table of a static pass: item b (``q_block`` queries, its output from padded row
    ``rows[b] * q_block``) at row ``rows[b]`` (``static_rows_of``, computed when not given)
    over ``chunks`` chunks from its first (a row of the bucket holding no item reads
    no keys: LEN 0 on the sentinel pages, ``null``); split between two cores
    (``static_split``), row p the core's half: chunks from c0 + p * chunks. In sections
    (``static_sections``) a row takes its section's chunks (``static_row_chunks``). The spans
    are unused (zeros)."""
    B = req.L.size
    if static_split(batch_rows, cores):
        table = np.zeros((2, META_COLS), np.int64)
        if B:
            if int(req.out[0]) != 0:             # both halves write row 0 (the kernel's)
                raise AssertionError("a split static pass's unit is output row 0")
            for p in range(2):
                a = req.c0[:1] + p * chunks
                table[p:p + 1] = req.items(np.arange(1), a, a + chunks, page_size)
        else:                      # no request: both halves read no keys
            table[:, PTR] = table[:, SLOT0] = null.slot
            table[:, C1], table[:, W_SPAN] = chunks, NO_WINDOW
        U = items_per_iteration(1)
        return DecodeWork(table.astype(np.int32), np.zeros((2, span_cols(U)), np.int32),
                          (float(chunks), float(chunks)))
    table = np.zeros((batch_rows, META_COLS), np.int64)
    if rows is None:
        rows = static_rows_of(req, batch_rows, cores, sections)
    counts = static_row_chunks(batch_rows, cores, chunks, sections)
    if B:
        if (req.out != np.arange(B) * q_block).any():     # the host maps item b to row rows[b]
            raise AssertionError("a static pass's rows are its units in output order")
        if (req.c1 - req.c0 > counts[rows]).any():
            raise AssertionError("a static pass's row holds fewer chunk slots than its request")
        table[rows] = req.items(np.arange(B), req.c0, req.c0 + counts[rows], page_size)
        table[rows, OUT] = rows * q_block        # row r writes output rows from r * q_block
    empty = np.setdiff1d(np.arange(batch_rows), rows)       # rows holding no item
    table[empty, PTR] = table[empty, SLOT0] = null.slot
    table[empty, C1], table[empty, W_SPAN] = counts[empty], NO_WINDOW
    table[empty, OUT] = empty * q_block
    U = items_per_iteration(1)
    spans = np.zeros((1, span_cols(U)), np.int64)
    return DecodeWork(table.astype(np.int32), spans.astype(np.int32),
                      (float(counts.sum()),))


# A static pass's skipped token: a cache row past any cache the indirect path reads (fewer than
# 2**24 rows), non-negative so that it reads the same as int32 and as a gather-transpose's uint32
SKIPPED_ROW = 1 << 24


def static_slot_rows(items: np.ndarray, pages: np.ndarray, page_size: int, rows_per_page: int,
                     entry_stride: int, chunks, windowed: bool) -> np.ndarray:
    """[T, total slots] int32: the cache row (of the [R, D] row view) of every token slot of a
    static pass (``static_work``'s table ``items``, ``pages`` the padded page list; ``chunks``
    the slots of every row, or [rows] each row's, ``static_row_chunks``): the rows' slots back
    to back, partition t of row r's column k holding token t of its chunk k (column
    r * chunks + k when all rows take ``chunks``), SKIPPED_ROW where that token is
    outside the row's keys [WIN, LEN) (WIN only when ``windowed``). Made on the host so a static
    pass's gathers wait on one DMA, not on a page-id load and address arithmetic per row. Only
    the indirect path reads it (caches of fewer than 2**24 rows); larger rows are clipped to
    SKIPPED_ROW to stay int32."""
    T = chunk_tokens(page_size)
    items = np.asarray(items, np.int64)
    pages = np.asarray(pages, np.int64).reshape(-1)
    counts = np.broadcast_to(np.asarray(chunks, np.int64), (items.shape[0],))
    chunks = int(counts.max(initial=0))
    rel = items[:, ENTRY0, None, None] + (np.arange(chunks)[:, None] * T + np.arange(T))[None]
    pos = items[:, POS0, None, None] - items[:, ENTRY0, None, None] + rel      # [rows, chunks, T]
    slot = np.clip(items[:, SLOT0, None, None] + rel // page_size, 0, pages.size - 1)
    row = pages[slot] * rows_per_page + (rel % page_size) * entry_stride
    ok = pos < items[:, LEN, None, None]
    if windowed:
        ok &= pos >= items[:, WIN, None, None]
    row = np.where(ok & (row >= 0), np.minimum(row, SKIPPED_ROW), SKIPPED_ROW)
    kept = np.arange(chunks)[None, :] < counts[:, None]            # [rows, chunks]
    return np.ascontiguousarray(row.transpose(2, 0, 1)[:, kept]).astype(np.int32)


def _unit_items(req: _Requests, tails=False):
    """Each unit's ``class_items`` and [units, kinds] how many of each kind (a unit with no keys:
    one empty item)."""
    B = req.L.size
    parts = [class_items(int(req.full_lo[b]), int(req.full_hi[b]), int(req.c0[b]), int(req.c1[b]),
                         tails) for b in range(B)]
    kinds = np.zeros((B, len(ITEM_CLASSES)), np.int64)
    for b in range(B):
        for kind, _, _ in parts[b] or [(0, 0, 0)]:
            kinds[b, kind] += 1
    return parts, kinds


def _core_load(chunks, counts, per_iteration, pad=False, item=None, iteration=None):
    """Modelled work of a core (in chunks): its chunks, a fixed cost per work item and one per
    loop iteration (``counts``: [..., kinds] items of each kind; ``pad``: each kind's count
    padded with null items, ``padded_counts``, each costing its kind's ``_null_costs``);
    ``item``, ``iteration``: those costs (ITEM_COST_CHUNKS, ITERATION_COST_CHUNKS unless
    given)."""
    item = ITEM_COST_CHUNKS if item is None else item
    iteration = ITERATION_COST_CHUNKS if iteration is None else iteration
    counts = np.asarray(counts, np.int64)
    looped, nulls = counts, 0.0
    if pad:
        looped = padded_counts(counts, per_iteration)
        nulls = ((looped - counts) * np.where(looped > counts, _null_costs(), 0.0)).sum(axis=-1)
    return (chunks + counts.sum(axis=-1) * item
            + loop_iterations(looped, per_iteration) * iteration + nulls)


# Null items: a kind's last loop iteration may be padded with items that do nothing visible (no
# keys read: their page ids point past the cache and every gather skips them; their output rows
# are past the launch's and the writes skip them, so do their state's load and store), so the
# kind's remainder runs as one iteration instead of one per power of two (a barrier and a
# pipeline fill each). A null item still runs its chunks' compute on stale tiles: only kinds of
# at most NULL_MAX_CHUNKS chunks are padded, when the model's costs favour it.
NULL_MAX_CHUNKS = 8
NULL_ITEM_FIXED_CHUNKS = 2.0       # a null item's setup and finish, chunk-equivalents (assumed)
NULL_CHUNK_COST = 0.5              # one of its chunks: compute only, no bytes (assumed)
NULL_ROWS = 2 * (DECODE_ITEMS_PER_ITERATION - 1) * len(ITEM_CLASSES)   # two cores, every kind


def _null_costs():
    """[kinds] the modelled cost of one null item of each kind (inf: never padded)."""
    costs = []
    for size, masked in ITEM_CLASSES:
        ok = 0 < size <= NULL_MAX_CHUNKS
        costs.append(NULL_ITEM_FIXED_CHUNKS + size * NULL_CHUNK_COST if ok else np.inf)
    return np.array(costs)


def _padded_remainders(per_iteration: int) -> np.ndarray:
    """[kinds, U] the count a kind's remainder r (< U items past its whole iterations) is padded
    to: the one in [r, U] of least modelled cost (iterations, and the null items), r itself on
    ties or when the kind is never padded. Made once per set of the costs it depends on (the
    plan asks for it per cut candidate and per kind)."""
    return _remainder_table(per_iteration, NULL_MAX_CHUNKS, NULL_ITEM_FIXED_CHUNKS,
                            NULL_CHUNK_COST, ITERATION_COST_CHUNKS)


@functools.lru_cache(maxsize=None)
def _remainder_table(U, max_chunks, fixed, per_chunk, iteration) -> np.ndarray:
    """``_padded_remainders`` for these costs (read-only: cached)."""
    costs = _null_costs()
    table = np.tile(np.arange(U), (len(ITEM_CLASSES), 1))
    for kind in range(len(ITEM_CLASSES)):
        if not np.isfinite(costs[kind]):
            continue
        for r in range(1, U):
            best, best_cost = r, bin(r).count("1") * iteration
            for m in range(r + 1, U + 1):
                iters = 1 if m == U else bin(m).count("1")
                cost = iters * iteration + (m - r) * costs[kind]
                if cost < best_cost:
                    best, best_cost = m, cost
            table[kind, r] = best
    table.flags.writeable = False
    return table


def padded_counts(counts, per_iteration: int) -> np.ndarray:
    """[..., kinds] each kind's item count with its last iteration padded by null items
    (``_padded_remainders``)."""
    counts = np.asarray(counts, np.int64)
    U = per_iteration
    if U == 1:
        return counts
    table = _padded_remainders(U)
    kinds = np.arange(len(ITEM_CLASSES))
    return counts // U * U + table[kinds, counts % U]


class NullItems(NamedTuple):
    """Where a launch's null items point: ``slot``, the first of the ``null_pages`` page-list
    entries holding a page past the cache; ``out``, the first output row past the launch's
    (padded) rows."""

    slot: int
    out: int


def null_pages(page_size: int) -> int:
    """Sentinel page-list entries after the real ones: what a null item of NULL_MAX_CHUNKS
    chunks reads its page ids from, and a static pass's last row past its request's pages
    (STATIC_MAX_CHUNKS chunks at most)."""
    return max(1, max(NULL_MAX_CHUNKS, STATIC_MAX_CHUNKS) * chunk_tokens(page_size) // page_size)


def _null_row(kind: int, null: NullItems, units: int) -> np.ndarray:
    """A null item of ``kind`` (see NullItems): no keys (LEN 0) on the sentinel pages, its
    output row and its state slot past the launch's (every access to them skips)."""
    size, masked = ITEM_CLASSES[kind]
    row = np.zeros(META_COLS, np.int64)
    row[PTR] = row[SLOT0] = null.slot
    row[C1] = size
    row[FULL_HI] = 0 if masked else size
    row[OUT] = null.out
    row[W_SPAN] = NO_WINDOW
    row[LOAD] = row[STORE] = state_slots(units)
    return row


def split_work(req: _Requests, page_size: int, batch_rows: int, cores: int = 1,
               per_iteration: int = 1, capacity: int = None, sharing: int = 1,
               whole: bool = False, null: NullItems = None, tails: bool = False,
               unit_tail: int = 0, group_units: int = 1, unit_tiles: int = None,
               lead: int = 0, lead_sizes=(), tailer=None) -> DecodeWork:
    """decode_work over any work items (requests or query blocks, ``query_blocks``); units are
    numbered by row, ``batch_rows`` of them (a bucket); ``sharing``: see ``table_rows``.
    ``whole``: one item per unit (``whole_units``), the spans [cores, WHOLE_UNIT_SPAN_COLS]:
    the core's whole units [FIRST, END), the row of its part of the unit split between two
    cores (a part with no chunks when the cut leaves it none) and whether one is: with two
    units or more each core takes whole units of its own, cut at a unit edge. ``null``: where
    null items point (``NullItems``): a flat list's kinds are then padded with them. ``tails``:
    each unit's last chunks are one TAIL item (``class_items``; ``tail_items`` says when the
    kernel takes them), its LEN clipped to the item's chunks; LATE_TAILS: late tails when they
    leave the slower core fewer loop iterations than none (their whole chunks gather a
    descriptor a token, so equal loops cost more: 32 x 64-2048 on two cores 409 -> 417 us).
    ``unit_tail``: whole units' tail slots (``unit_tail_chunks``; their rows
    ``with_unit_tail``); ``group_units``: whole units a loop iteration takes
    (``whole_group_units``), whose rounds the rows then carry (``with_rounds``);
    ``unit_tiles``: a whole unit's tiles of score rows (its chunks' cost against a loop
    iteration's, ``_whole_halves``; None: iterations over units not weighed); ``lead``: whole
    units each core takes at least (``lead_units``); ``lead_sizes``: the tail slots the cores'
    lead groups may take instead of ``unit_tail`` (``lead_tail_slots``); ``tailer``: how the
    whole units' tails are chosen (``tailed_units`` by default; ``tail_programs.choose``)."""
    args = (req, batch_rows, cores, per_iteration, capacity, whole, null)
    loops = None
    if whole and cores == 2 and req.L.size > 1:
        loops = whole_unit_loops(req, unit_tail, rounds_taken(unit_tail, group_units, page_size,
                                                              batch_rows, cores))
    planned = _split_plan(*args, tails, group_units, unit_tiles, lead, loops)
    if tails == LATE_TAILS and not whole:
        plain = _split_plan(*args, False)
        if _iterations(planned) >= _iterations(plain):
            planned = plain
    return _split_table(planned, page_size, batch_rows, cores, sharing, whole, null, unit_tail,
                        group_units, lead, lead_sizes, tailer)


class _Planned(NamedTuple):
    """``_split_plan``'s result: the units (reordered when grouped), per core [(unit, slot,
    items)], the split unit and its cut chunk, the cores' modelled loads, items per iteration,
    whether kinds are padded with null items, the table's chunk capacity."""

    req: _Requests
    plan: list
    split: object
    cut: object
    loads: tuple
    U: int
    pad: bool
    capacity: int


def _iterations(planned: _Planned) -> int:
    """Loop iterations of the slower core of a flat list's plan (its kinds padded with null
    items as ``_kind_rows`` pads them)."""
    most = 0
    for units in planned.plan:
        counts = np.zeros(len(ITEM_CLASSES), np.int64)
        for b, _, its in units:
            if not its and b != planned.split:
                counts[0] += 1                     # no keys: its empty result
            for kind, _, _ in its:
                counts[kind] += 1
        if planned.pad:
            counts = padded_counts(counts, planned.U)
        most = max(most, int(loop_iterations(counts, planned.U)))
    return most


def _split_plan(req: _Requests, batch_rows: int, cores: int, per_iteration: int, capacity,
                whole: bool, null, tails, group_units: int = 1, unit_tiles: int = None,
                lead: int = 0, unit_loops=None) -> _Planned:
    """``split_work``'s share of the units between the cores, with ``tails`` as given;
    ``unit_loops``: whole units' loop iterations (``whole_unit_loops``) for ``_whole_halves``."""
    U = per_iteration
    pad = null is not None and not whole
    loop_widths(U)                      # refuses a per_iteration that is not a power of two
    if cores not in (1, 2):
        raise ValueError(f"cores={cores!r} must be 1 or 2")
    B = req.L.size
    chunks = (req.c1 - req.c0).astype(np.int64)
    if capacity is None:
        capacity = int(chunks.sum()) + 1
    tails = False if whole else tails
    parts, kinds = _unit_items(req, tails)
    # per core: [(unit, slot, item rows' kinds and ranges)] and the split unit's part
    if cores == 1:
        plan = [[(b, b, parts[b]) for b in range(B)]]
        split, cut, loads = None, None, (float(_core_load(chunks.sum(), kinds.sum(axis=0), U, pad)),)
    elif B == 0:
        plan, split, cut, loads = [[], []], None, None, (0.0, 0.0)
    elif whole and B == 1 and batch_rows == 2:
        if null is None:
            raise ValueError("a bucket of two whole units on two cores holding one: null (its "
                             "rows' end, NullItems.out) places the empty one")
        # a bucket of two holding one unit (a bucket policy's minimum): the unit on core 0, an
        # empty one on core 1 over the bucket's padded rows (the second half of the rows up to
        # ``null.out``), so with two units each core runs exactly one and the kernel no loop
        # over them (``run_whole_units``)
        plan = [[(0, 0, parts[0])], [(-1, null.out // 2, [])]]
        split, cut = None, None
        loads = (float(_core_load(chunks.sum(), kinds.sum(axis=0), U)), 0.0)
    elif whole and B > 1:
        # whole units on two cores: each core runs units of its own, the two sets the ones
        # where the slower core has the least modelled work; no unit is split (a split one
        # costs both cores its queries and every tile's exchange and merge)
        ones, loads = _whole_halves(chunks, kinds, U, pad, group_units, unit_tiles, lead,
                                    unit_loops)
        plan = [[(b, b, parts[b]) for b in range(B) if not ones[b]],
                [(b, b, parts[b]) for b in range(B) if ones[b]]]
        split, cut = None, None
    else:
        # the cut of the units in their order, or grouped by the kinds of item they have (each
        # core then runs fewer kinds, so fewer loops: a spread batch), whichever leaves the
        # slower core less modelled work
        options = [_cut(req, parts, kinds, chunks, batch_rows, U, pad, np.arange(B), tails)]
        if not whole and B > 2:
            grouped = np.lexsort(tuple(kinds[:, k] > 0 for k in range(kinds.shape[1]))[::-1])
            if (grouped != np.arange(B)).any():
                moved = _Requests(*(f[grouped] if isinstance(f, np.ndarray) else f for f in req))
                options.append(_cut(moved, [parts[b] for b in grouped], kinds[grouped],
                                    chunks[grouped], batch_rows, U, pad, grouped, tails))
        req, plan, split, cut, loads = min(options, key=lambda o: (max(o[4]), o[4][0]))
    return _Planned(req, plan, split, cut, loads, U, pad, capacity)


# Whole units a launch may have for ``_whole_halves`` to weigh every way of sharing them between
# two cores (2 ** (units - 1) ways: 0.2 ms of host time at 10, 5 ms at 14); more weigh the cuts
# in their order, a greedy sharing and the units in turns by their work.
WHOLE_HALVES_SEARCH_UNITS = 10
# A loop iteration over whole units and one of a unit's own loops (their barrier, fill and
# drain), in chunks of one tile of score rows; a unit's chunk costs its tiles'. Least squares
# over one core's end in LNC=2 prefill launches of the chunked replays (64 to 256 tokens a
# chunk), each run with eight random sharings of its units, an intercept per launch (cost
# model, trn2; benchmarks/whole_halves.py): ten launches gave a tile-chunk 0.25 us, an
# iteration over units 18.8 us (75 tile-chunks), a unit's loop iteration 28.6 us (115), rms 12
# us; the script's nine launches 0.23 us, 23.8 (103), 34.4 (149), rms 13 us. The replays
# weigh the first pair better (chunk-64 LNC=2 277.5 against 281.2 us a step, chunk-128 312.7
# against 314.2) and move little over a wide range (a loop at 1.5-6 chunks of 16 tiles:
# 276.5-277.6 us).
WHOLE_ITERATION_TILE_CHUNKS = 75.0
UNIT_LOOP_TILE_CHUNKS = 115.0


def group_iterations(n, per):
    """Loop iterations ``kernel.run_whole_units`` takes over ``n`` units (an array) of a core:
    its ``unit_groups``, then the unit left alone, if any."""
    n = np.asarray(n, np.int64)
    table = []
    for k in range(int(n.max(initial=0)) + 1):
        groups = unit_groups(0, k, per)
        table.append(len(groups) + k - sum(size for _, size in groups))
    return np.asarray(table, np.int64)[n]


def _whole_halves(chunks, kinds, U, pad, group_units=1, unit_tiles=None, least=0,
                  unit_loops=None):
    """Which core (0 / 1 per unit) runs each of B >= 2 whole units, and the two cores' modelled
    loads: with ``unit_loops`` (each unit's own loop iterations, ``whole_unit_loops``) and
    ``unit_tiles``, a core's chunks plus its units' loop iterations and its iterations over
    units (``group_iterations`` of ``group_units``), each WHOLE_ITERATION_TILE_CHUNKS /
    ``unit_tiles`` chunks; without, ``_core_load`` by kinds of item (plus, given ``unit_tiles``,
    the iterations over units). Of the ways that give each core a unit, the one whose slower
    core has the least (then the closer pair): any units on either core when there are at
    most WHOLE_HALVES_SEARCH_UNITS, else the cuts in their order, ``_greedy_halves`` and the
    units taken in turns by their work (cost model, trn2, LNC=2: four prompt chunks of 256 over
    1315 / 1049 / 892 / 591 keys 418.8 -> 383.2 us with 1315 and 591 on one core, not the
    first two; twelve chunks of 64 over 10, 10, 10, 10, 10, 9, 8, 8, 7, 6, 4, 3 chunks of keys
    418.5 -> 349.2 us weighing each unit's loops, not the kinds of its items: the cores had
    6 and 2 loop barriers, now 4 each). Each core takes at least ``least`` units
    (``lead_units``; the cuts between them are always among the ways)."""
    B = len(chunks)
    per = WHOLE_ITERATION_TILE_CHUNKS / unit_tiles if unit_tiles else 0.0
    weight = np.asarray(chunks, np.float64)
    if unit_loops is not None and unit_tiles:
        weight = weight + UNIT_LOOP_TILE_CHUNKS / unit_tiles * np.asarray(unit_loops, np.float64)
    if B <= WHOLE_HALVES_SEARCH_UNITS:     # unit 0 on core 0; the others' bits say core 1
        ways = np.arange(1, 1 << (B - 1))
        ones = np.concatenate([np.zeros((ways.size, 1), np.int64),
                               (ways[:, None] >> np.arange(B - 1)) & 1], axis=1)
    else:                                  # the cuts (units [k, B) on core 1), greedy, turns
        turns = np.zeros(B, np.int64)
        turns[np.argsort(-weight, kind="stable")[1::2]] = 1
        ones = np.vstack([(np.arange(B)[None, :] >= np.arange(1, B)[:, None]).astype(np.int64),
                          _greedy_halves(weight)[None, :], turns[None, :]])
    count = ones.sum(axis=1)                       # core 1's units in each way
    keep = (count >= least) & (B - count >= least)
    ones, count = ones[keep], count[keep]
    if unit_loops is not None and unit_tiles:
        side = [(1 - ones) @ weight, ones @ weight]
    else:
        side = [_core_load((1 - ones) @ chunks, (1 - ones) @ kinds, U, pad),
                _core_load(ones @ chunks, ones @ kinds, U, pad)]
    side = [side[0] + per * group_iterations(B - count, group_units),
            side[1] + per * group_iterations(count, group_units)]
    best = np.lexsort((np.abs(side[0] - side[1]), np.maximum(side[0], side[1])))[0]
    return ones[best], (float(side[0][best]), float(side[1][best]))


def _greedy_halves(work):
    """[B] 0 / 1: the core of each unit, the most ``work`` (chunks, or modelled chunks) first,
    each to the core with less so far (the first two to different cores)."""
    ones = np.zeros(len(work), np.int64)
    load = [0.0, 0.0]
    for b in np.argsort(-np.asarray(work), kind="stable"):
        core = 0 if load[0] <= load[1] else 1
        ones[b] = core
        load[core] += float(work[b])
    return ones


def whole_unit_loops(req: _Requests, unit_tail: int, rounds: bool) -> np.ndarray:
    """[B] loop iterations of each whole unit of ``req`` (what ``_whole_halves`` weighs beside
    its chunks): with tails (``unit_tail`` slots), those of its chunks before the tail start
    ``with_unit_tail`` would choose (its group's rounds counted as ``_rounded_loop_cost`` does
    when ``rounds``) plus UNIT_TAIL_EMPTY_SLOT an empty slot; without, ``_unit_loop_cost``."""
    loops = np.zeros(req.L.size, np.float64)
    for b in range(req.L.size):
        bounds = (int(req.c0[b]), int(req.full_lo[b]), int(req.full_hi[b]), int(req.c1[b]))
        loops[b] = (unit_tail_cost(*bounds, unit_tail, rounds)[0] if unit_tail
                    else _unit_loop_cost(*bounds))
    return loops


def tailed_units(untailed, spans, per, lead, slots, page_size, batch_rows, cores, mode, sizes,
                 lead_tail=None, profile=None, key=None):
    """(rows, lead tails, profile) of whole units ``untailed`` (rows before ``with_unit_tail``)
    under tail-profile ``mode``: the lead groups' tails (``lead_tail_slots`` over
    ``sizes`` = (the sizes a lead group may take, the launch's menu), or ``lead_tail``), the
    rows with their rounds (``with_rounds``, which sorts them) and the profile
    (``tail_profile``, or ``profile``). The inputs are not changed; ``key`` is ignored
    (``_split_table``'s default choice; ``tail_programs.choose`` takes it too)."""
    lead_sizes, menu = sizes
    untailed = [row.copy() for row in untailed]
    rows = [with_unit_tail(row, slots, page_size, True) for row in untailed]
    if lead_tail is None:
        lead_tail = lead_tail_slots(rows, untailed, spans, per, lead, slots, lead_sizes, mode,
                                    menu)
    rows = with_rounds(rows, spans, per, page_size, batch_rows, cores, untailed, slots, lead,
                       lead_tail)
    if profile is None:
        profile = tail_profile(rows, spans, per, lead, slots, lead_tail, page_size, menu, mode)
    return rows, lead_tail, profile


def _split_table(planned: _Planned, page_size: int, batch_rows: int, cores: int, sharing: int,
                 whole: bool, null, unit_tail: int, group_units: int = 1,
                 lead: int = 0, lead_sizes=(), tailer=None) -> DecodeWork:
    """The device tables of ``planned`` (``split_work``; ``lead``: ``lead_units``; ``tailer``:
    how whole units' tails are chosen, as ``tailed_units``, which it defaults to)."""
    req, plan, split, cut, loads, U, pad, capacity = planned
    lead_tail, profile = (), ()
    if whole:
        rows, spans = _whole_rows(req, plan, split, cut, page_size)
        rounds = rounds_taken(unit_tail, group_units, page_size, batch_rows, cores)
        # "lead" under LNC=2 only: under LNC=1 the chunked replays paid more programs than
        # it saved (cost model, trn2, chunks of 64: 405.9 -> 403.6 us a step for 11 -> 16
        # fused-kernel compiles; of 128 488.1 -> 485.5 for 19 -> 21; the suite's LNC=1 rows
        # unchanged); under LNC=2 the spread chunked-prefill row 254.5 -> 235.1 us
        mode = tail_profile_mode()
        if mode == "lead" and cores == 1:
            mode = "off"
        if rounds and GROUP_TAILS:
            key = (batch_rows, cores, group_units, lead, unit_tail, page_size)
            rows, lead_tail, profile = (tailer or tailed_units)(
                rows, spans, group_units, lead, unit_tail, page_size, batch_rows, cores,
                mode, (lead_sizes, tail_slots_mode()), key=key)
        else:
            rows = [with_unit_tail(row, unit_tail, page_size, rounds) for row in rows]
        if rounds and not GROUP_TAILS:
            rows = with_rounds(rows, spans, group_units, page_size, batch_rows, cores, None,
                               unit_tail, lead)
            profile = tail_profile(rows, spans, group_units, lead, unit_tail, (), page_size,
                                   tail_slots_mode(), mode)
    else:
        rows, spans = _kind_rows(req, plan, split, page_size, batch_rows, cores, U,
                                 null if pad else None)
    n_rows = table_rows(batch_rows, capacity, sharing)
    if len(rows) > n_rows:
        raise AssertionError(f"{len(rows)} work items exceed the table's {n_rows} rows")
    table = np.zeros((n_rows, META_COLS), np.int64)
    if rows:
        table[:len(rows)] = np.array(rows)
    return DecodeWork(table.astype(np.int32), spans.astype(np.int32), loads, profile)


def _cut(req: _Requests, parts, kinds, chunks, batch_rows, U, pad, slots, tails=False):
    """Two cores' share of units ``req`` in their order: every cut (unit k, chunk c) gives core 0
    the units before k and chunks [c0, c) of k, core 1 the rest; the cut with the least
    modelled time of the slower core (its chunks, items and loop iterations, each kind's loops
    counted exactly), ties going to the most even. Returns (req, plan, split unit, cut chunk,
    loads); ``parts``, ``kinds``: ``_unit_items(req)``; ``slots``: each unit's scratch slot
    (its row in the caller's order)."""
    B = req.L.size
    k = np.repeat(np.arange(B), chunks + 1)
    c = req.c0[k] + (np.arange(k.size) - np.repeat(np.cumsum(chunks + 1) - chunks - 1,
                                                   chunks + 1))
    lo, hi, c0, c1 = req.full_lo[k], req.full_hi[k], req.c0[k], req.c1[k]
    before_kinds = np.concatenate([np.zeros((1, kinds.shape[1]), np.int64),
                                   np.cumsum(kinds, axis=0)])
    before_chunks = np.concatenate([[0], np.cumsum(chunks)])
    costs = dict(item=CUT_ITEM_COST_CHUNKS, iteration=CUT_ITERATION_COST_CHUNKS)
    side = [_core_load(before_chunks[k] + (c - c0),
                       before_kinds[k] + _kind_counts(lo, hi, c0, c, tails), U, pad, **costs),
            _core_load(before_chunks[B] - before_chunks[k + 1] + (c1 - c),
                       before_kinds[B] - before_kinds[k + 1] + _kind_counts(lo, hi, c, c1, tails),
                       U, pad, **costs)]
    best = np.lexsort((np.abs(side[0] - side[1]), np.maximum(side[0], side[1])))[0]
    split, cut = int(k[best]), int(c[best])
    lo_k, hi_k = int(req.full_lo[split]), int(req.full_hi[split])
    halves = (class_items(lo_k, hi_k, int(req.c0[split]), cut, tails),
              class_items(lo_k, hi_k, cut, int(req.c1[split]), tails))
    plan = [[(split, batch_rows, halves[0])]
            + [(b, int(slots[b]), parts[b]) for b in range(split)],
            [(split, batch_rows + 1, halves[1])]
            + [(b, int(slots[b]), parts[b]) for b in range(split + 1, B)]]
    return req, plan, split, cut, (float(side[0][best]), float(side[1][best]))


def _whole_rows(req: _Requests, plan, split, cut, page_size):
    """Work-item rows and spans of whole units: per core its units in order, then (two cores)
    its part of the unit ``split``: chunks [c0, cut) on core 0, [cut, c1) on core 1, an item
    over no chunks (the identity) when the part is empty; no split unit (``split`` None): that
    row is not run (span column 3 is 0). ``plan``: per core [(unit, slot, items)]."""
    rows, spans = [], np.zeros((len(plan), WHOLE_UNIT_SPAN_COLS), np.int64)
    for p, units in enumerate(plan):
        spans[p, 0] = len(rows)
        for b, slot, _ in units:
            if b == -1:                   # an empty unit over the bucket's padded rows
                row = np.zeros(META_COLS, np.int64)
                row[OUT], row[W_SPAN] = slot, NO_WINDOW
                rows.append(row)
            elif b != split:
                rows.append(req.items(np.array([b]), req.c0[b:b + 1], req.c1[b:b + 1],
                                      page_size)[0])
        spans[p, 1] = len(rows)
        if len(plan) == 2:
            if split is None:
                row = np.zeros(META_COLS, np.int64)
            else:
                a, e = (int(req.c0[split]), cut) if p == 0 else (cut, int(req.c1[split]))
                a, e = (a, e) if a < e else (0, 0)
                row = req.items(np.array([split]), np.array([a]), np.array([e]), page_size)[0]
            spans[p, 2] = len(rows)
            spans[p, 3] = 0 if split is None else 1
            rows.append(row)
    return rows, spans


def _last_items_keep_nothing(rows, batch_rows):
    """A unit's last item on a core (``rows``: the core's, in the order it runs them) stores no
    state (STORE: the slot past the scratch, whose store skips): no later item loads it. The
    parts of a unit split between the cores (slots batch_rows, batch_rows + 1) keep theirs for
    the merge; null items' already point past."""
    past = state_slots(batch_rows)
    last = {}
    for i, row in enumerate(rows):
        last[int(row[STORE])] = i
    for slot, i in last.items():
        if slot < batch_rows:
            rows[i][STORE] = past


def _kind_rows(req: _Requests, plan, split, page_size, batch_rows, cores, U, null=None):
    """Work-item rows and spans of the flat list: per core, items grouped by kind (ITEM_CLASSES
    order) in unit order, each chained from its unit's previous item through the scratch; with
    ``null`` (``NullItems``), each kind's last iteration padded with null items
    (``padded_counts``)."""
    widths = loop_widths(U)
    ident = state_slots(batch_rows) - 1
    rows, spans = [], np.zeros((cores, span_cols(U)), np.int64)
    for p, units in enumerate(plan):
        chained = set()
        first_row = len(rows)
        for kind, _ in enumerate(ITEM_CLASSES):
            mine = []
            for b, slot, its in units:
                if not its and kind == 0 and b != split:
                    its = [(0, int(req.c0[b]), int(req.c0[b]))]    # no keys: its empty result
                for k_, a, e in its:
                    if k_ == kind:
                        row = req.items(np.array([b]), np.array([a]), np.array([e]), page_size)[0]
                        if kind == TAIL:     # its slots past e read nothing (a split part's)
                            row[LEN] = min(row[LEN], e * chunk_tokens(page_size))
                        row[LOAD] = slot if slot in chained else ident
                        row[STORE] = slot
                        chained.add(slot)
                        mine.append(row)
            if null is not None and mine:
                n = len(mine)
                target = n // U * U + int(_padded_remainders(U)[kind, n % U])
                for _ in range(target - n):
                    mine.append(_null_row(kind, null, batch_rows))
            start = len(rows)
            rows.extend(mine)
            for w in widths:                  # whole iterations of each width, widest first
                col = span_column(kind, w, U)
                n = (len(rows) - start) // w * w
                spans[p, col], spans[p, col + 1] = start, start + n
                start += n
        _last_items_keep_nothing(rows[first_row:], batch_rows)
        starts = iteration_starts(spans[p], U)
        for a, b in zip(starts, starts[1:] + [0]):
            rows[a][NEXT] = b
        spans[p, span_start(U)] = starts[0] if starts else 0
        if split is not None:
            spans[p, -2] = (split_slot(batch_rows, p) if split_slot(batch_rows, p) in chained
                            else ident)
            spans[p, -1] = req.out[split]
        else:
            spans[p, -2], spans[p, -1] = ident, 0
    return rows, spans
