"""Launch plans of the attention kernel: from checked arguments to the kernel's arrays and
static arguments (work items from ``work.py``, padded to shape buckets so one compile serves a
bucket), and where each query row sits in the padded launch.

``prepare_decode`` and ``prefill_parts`` take shape-and-dtype stand-ins for q and the cache (only
their metadata is read) and host NumPy index arrays, so the NumPy entries and the torch device
path build and run the same plan.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

import numpy as np

from nki_kernels.buckets import bucket, bucket_floor, lead_mode, pad_rows, tail_slots_mode
from nki_kernels.launch_options import host_nc_version
from nki_kernels.paged_cache.layout import split_cache

from . import plan_cache, tail_programs
from .checks import check_batch_decode_inputs, soft_cap
from .custom_mask import mask_table, with_mask_free_chunks
from .work import (C0, C1, LATE_TAILS, NO_WINDOW, NullItems, capacity_chunks, chunk_tokens,
                   decode_work, item_query_bytes, items_per_iteration, launch_lead, lead_units,
                   null_pages, query_blocks, score_tiling, section_parts, split_work,
                   static_core_rows, static_full_slots, static_pack, static_pass, static_row_bytes,
                   right_aligned, static_row_chunks, static_rows_of, static_sections,
                   static_slot_rows, static_work, tail_items, token_table, unit_tail_chunks,
                   unit_tail_slots, whole_group_units, whole_units, window_span)


def cache_rows(paged_kv_cache, D):
    """The kernel's (k_rows, v_rows): the cache as rows of D elements [R, D] (v_rows None for a
    fused cache, whose V rows follow K's)."""
    k, v, fused = split_cache(paged_kv_cache)
    if fused:
        return np.ascontiguousarray(paged_kv_cache).reshape(-1, D), None
    return np.ascontiguousarray(k).reshape(-1, D), np.ascontiguousarray(v).reshape(-1, D)


def _tails(prob, paged_kv_cache, qb) -> bool:
    """``work.tail_items`` for this launch's units of ``qb`` queries (the kernel's row view of
    the cache: ``cache_rows``; its query tiles: ``kernel.make_step``)."""
    rows = _cache_row_count(paged_kv_cache, prob.geo.head_dim)
    query_tiles = -(-qb // max(1, 128 // prob.group))
    return tail_items(host_nc_version(), prob.geo.page_size, rows, whole_units(qb), query_tiles)


def _unit_tail(prob, paged_kv_cache, masks, qb, causal, items) -> tuple:
    """(tail slots of this launch's whole units ``items``, the larger sizes its first lead
    groups may take): the slots at most ``work.unit_tail_chunks``, a static kernel argument:
    of the sizes ``buckets.tail_slots_mode`` allows (2, 4 or 8 unless set), the one
    ``work.unit_tail_slots`` picks over the units; the sizes those allow up to the same limit
    (``work.lead_tail_slots`` picks among them). Causal launches only, whose units all end in
    masked chunks (a mask-free unit's tail would be empty slots or cost its blocks loops: a
    cascade's shared level of 32 chunks on two cores, 158 -> 182 us); (0, ()) for blocks of
    queries that are not whole units."""
    if not (causal and whole_units(qb)):
        return 0, ()
    limit = unit_tail_chunks(host_nc_version(), prob.geo.page_size,
                             _cache_row_count(paged_kv_cache, prob.geo.head_dim),
                             masks is not None, _chunk_bytes(prob, paged_kv_cache))
    sizes = tail_slots_mode()
    slots = unit_tail_slots(limit, zip(items.c0, items.full_lo, items.full_hi, items.c1), sizes)
    return slots, tuple(size for size in sizes if slots < size <= limit)


def _cache_row_count(paged_kv_cache, head_dim) -> int:
    """Rows of head_dim in the kernel's view of the cache (``cache_rows``; K's alone when K and
    V are two arrays)."""
    k, _, fused = split_cache(paged_kv_cache)
    return int(np.prod((paged_kv_cache if fused else k).shape)) // head_dim


def _matmul_dtype(k_dtype):
    """(name, bytes) of the kernel's matmul dtype for a K cache of ``k_dtype``: the cache's own
    from 2 bytes up, bfloat16 for fp8."""
    return (k_dtype.name, k_dtype.itemsize) if k_dtype.itemsize >= 2 else ("bfloat16", 2)


def _chunk_bytes(prob, paged_kv_cache) -> int:
    """Bytes per partition of one chunk's K and V in SBUF (``work.static_pass``)."""
    itemsize = split_cache(paged_kv_cache)[0].dtype.itemsize
    return prob.geo.num_heads * (chunk_tokens(prob.geo.page_size) + prob.geo.head_dim) * itemsize


def _row_bytes(prob, paged_kv_cache, q_block=1) -> int:
    """Bytes per partition of one row's query stationaries (``work.static_row_bytes``)."""
    mm_bytes = _matmul_dtype(split_cache(paged_kv_cache)[0].dtype)[1]
    return static_row_bytes(prob.geo.num_heads, prob.group, prob.geo.head_dim, mm_bytes,
                            q_block)


def _pack(prob, paged_kv_cache, rows, cores) -> int:
    """Requests a static pass's tile of score rows would hold (``work.static_pack``)."""
    mm_bytes = _matmul_dtype(split_cache(paged_kv_cache)[0].dtype)[1]
    return static_pack(static_core_rows(rows, cores), prob.geo.num_heads, prob.group, mm_bytes)


def torch_index(a: np.ndarray, device):
    """A plan's host array as a torch tensor on ``device`` (a kept plan's arrays are read-only,
    ``plan_cache``: those are copied, which torch wants of an array it may not write)."""
    import torch
    return torch.from_numpy(a if a.flags.writeable else a.copy()).to(device)


@dataclass(frozen=True)
class DecodeLaunch:
    """What the host prepared: the kernel's array arguments after the cache rows, its static
    arguments, and the batch bucket."""

    arrays: tuple
    statics: tuple
    batch: int
    bucket: int
    rows: np.ndarray = None   # [batch] the padded row of each request (None: row b)

    def pad_queries(self, q):
        """q padded with zero rows to the batch bucket, request b at its row (a NumPy array,
        or a torch tensor)."""
        if self.rows is None:
            return pad_rows(q, self.bucket)
        shape = (self.bucket,) + tuple(q.shape[1:])
        if isinstance(q, np.ndarray):
            out = np.zeros(shape, q.dtype)
            out[self.rows] = q
            return out
        import torch
        out = q.new_zeros(shape)
        out[torch_index(self.rows, q.device)] = q
        return out

    def unpad(self, out):
        """Each request's row of a padded kernel output (NumPy or torch)."""
        if self.rows is None:
            return out[:self.batch]
        if isinstance(out, np.ndarray):
            return out[self.rows]
        import torch
        return out[torch_index(self.rows, out.device)]

    @property
    def static_chunks(self) -> int:
        """Chunks per row of the launch's static pass (``work.static_pass``), 0 for device loops."""
        return static_chunks(self.statics)


def prepare_decode(q, paged_kv_cache, kv_indptr, kv_indices, kv_last_page_len, kv_layout, sm_scale,
                   logits_soft_cap, window_left, sinks, k_scale, v_scale, cores=1) -> DecodeLaunch:
    """Host half: validate, and build the small index arrays the kernel reads, padded to buckets.

    ``q``/``paged_kv_cache`` may be shape-and-dtype stand-ins (only their metadata is read); the
    index arrays must be host NumPy arrays. Only shapes and model constants become static
    arguments; lengths and pages are device data. A call identical to a recent one but for q's
    and the cache's contents (the next layer of the step) is handed its launch: the same
    checks passed then (``plan_cache``).
    """
    return plan_cache.reused(_prepare_decode, (q, paged_kv_cache, kv_indptr, kv_indices,
                                               kv_last_page_len, kv_layout, sm_scale,
                                               logits_soft_cap, window_left, sinks, k_scale,
                                               v_scale, cores), (0, 1))


def _prepare_decode(q, paged_kv_cache, kv_indptr, kv_indices, kv_last_page_len, kv_layout,
                    sm_scale, logits_soft_cap, window_left, sinks, k_scale, v_scale,
                    cores=1) -> DecodeLaunch:
    """``prepare_decode`` planned afresh (and checked)."""
    logits_soft_cap = soft_cap(logits_soft_cap)
    prob = check_batch_decode_inputs(q, paged_kv_cache, kv_indptr, kv_indices, kv_last_page_len,
                                     kv_layout, sm_scale, logits_soft_cap, window_left, sinks,
                                     k_scale, v_scale)
    rows = bucket(prob.batch)
    null = null_items(prob.geo, prob.table, rows)
    req = query_blocks(prob.table.indptr, prob.kv_lens, np.ones_like(prob.kv_lens), 1,
                       window_left, True, prob.geo.page_size)
    pack = _pack(prob, paged_kv_cache, rows, cores)
    chunks = static_pass(req, prob.geo.page_size, rows, cores, host_nc_version(),
                         _chunk_bytes(prob, paged_kv_cache), _row_bytes(prob, paged_kv_cache),
                         pack)
    static, order = (), None
    if chunks:
        work, static, order = _static_plan(req, prob.geo.page_size, rows, chunks, null, cores,
                                           pack)
        if (order == np.arange(order.size)).all():
            order = None
    else:
        work = decode_work(prob.table.indptr, prob.kv_lens, window_left, prob.geo.page_size,
                           rows, cores, capacity=table_capacity(prob.geo, prob.table), null=null,
                           tails=LATE_TAILS if _tails(prob, paged_kv_cache, 1) else False)
    arrays, statics = kernel_arguments(prob, paged_kv_cache, work, None,
                                       sinks, logits_soft_cap, k_scale, v_scale,
                                       static=static,
                                       window_left=window_left)
    return DecodeLaunch(arrays, statics, prob.batch, rows, order)


def _static_plan(req, page_size, batch_rows, chunks, null, cores, pack=1, q_block=1):
    """A static pass's work table, static arguments (chunks, full slots:
    ``work.static_full_slots``; in sections, ``work.static_sections``, also ((rows a core,
    chunks, full slots) of each section, ``work.section_parts``) and each item's table row
    (``work.static_rows_of``). ``work.static_pass_menu`` lists every value they can take."""
    sections = static_sections(req, batch_rows, cores, chunks, pack)
    rows = static_rows_of(req, batch_rows, cores, sections)
    work = static_work(req, page_size, batch_rows, chunks, null, cores, rows, sections, q_block)
    if not sections:
        return (work, (chunks, static_full_slots(req, page_size, batch_rows, chunks, cores)),
                rows)
    counts = static_row_chunks(batch_rows, cores, chunks, sections)[rows]
    full = static_full_slots(req, page_size, batch_rows, chunks, cores,
                             np.flatnonzero(counts == chunks))
    return work, (chunks, full, section_parts(sections, full)), rows


def static_chunks(statics) -> int:
    """The static pass's chunks per row in a launch's static arguments (``kernel_arguments``),
    0 for device loops."""
    static = statics[STATIC_PASS]
    return static[0] if static else 0


def page_table_rows(geo, table) -> int:
    """Rows of the padded page list the kernel reads: the cache's pages or the bucket of the
    table's, whichever is more, plus a chunk of slack (a shape of the cache and the bucket)."""
    return max(geo.num_pages, bucket(table.pages)) + chunk_tokens(geo.page_size)


def null_items(geo, table, out_rows, mask=None):
    """Where the launch's null items point (``work.NullItems``): the sentinel entries after the
    padded page list, and the first output row past ``out_rows``; None (no null items) with a
    custom mask (its table has no rows for them)."""
    if mask is not None:
        return None
    return NullItems(page_table_rows(geo, table), out_rows)


def table_capacity(geo, table) -> int:
    """Chunks the padded page list can hold: sets the work-item table's static row count."""
    return capacity_chunks(page_table_rows(geo, table), geo.page_size)


# Where kernel_arguments' static arguments hold the static pass, whether windows are checked,
# whole units' tail slots, the units a bucket guarantees and the tail slots per body and unit
# position
STATIC_PASS, WINDOWED, UNIT_TAIL, LEAD_UNITS, TAIL_PROFILE = 8, 9, 10, 11, 12


def kernel_arguments(prob, paged_kv_cache, work, row_tab, sinks,
                     logits_soft_cap, k_scale, v_scale, mask_bits=None, static=(),
                     window_left=-1, unit_tail=0, lead=0):
    """The kernel's array arguments after the cache rows (work tables, padded page list, token
    table, row table, sinks, custom-mask table) and its static arguments, for checked inputs
    ``prob`` (``static``: the static pass's chunks per item, ``work.static_pass``, or ();
    ``window_left``: whether the kernel checks window starts at all is static, a model constant;
    ``unit_tail``: whole units' tail slots, ``_unit_tail``; ``lead``: ``work.lead_units``;
    the tail slots per body and unit position: ``work.tail_profile``)."""
    geo = prob.geo
    k_dtype = split_cache(paged_kv_cache)[0].dtype
    table = prob.table
    real = page_table_rows(geo, table)
    padded = np.zeros((real + null_pages(geo.page_size), 1), np.int32)
    padded[:table.pages, 0] = table.indices[:table.pages]
    padded[real:, 0] = geo.num_pages          # null items' pages: past the cache, skipped
    mm_dtype = _matmul_dtype(k_dtype)[0]
    sinks32 = None if sinks is None else np.asarray(sinks, np.float32).reshape(-1, 1)
    spans = work.spans
    if static:                 # no loops: the pass's token slots' cache rows instead
        rpp, es, _ = geo.d_row_strides
        counts = work.items[:, C1] - work.items[:, C0]      # each row's chunk slots
        spans = static_slot_rows(work.items, padded, geo.page_size, rpp, es, counts,
                                 window_span(window_left) != NO_WINDOW)
    arrays = (work.items, spans, padded, token_table(geo.page_size), row_tab, sinks32,
              mask_bits)
    statics = (geo.num_heads, geo.page_size, geo.d_row_strides, tuple(geo.token().pattern),
               prob.sm_scale * float(k_scale),
               float(logits_soft_cap), float(v_scale), mm_dtype, tuple(static),
               window_span(window_left) != NO_WINDOW, int(unit_tail), int(lead),
               tuple(work.tail_profile))
    return arrays, statics


# SBUF per partition for the per-tile state of a work item (acc [R, D] fp32 and Q^T pieces [Dp, R]
# in 16 bits: about 6 D bytes per tile), which bounds how many tiles of query tokens an item takes
ITEM_TILE_BYTES = 64 * 1024
# At most 8 tiles of query tokens per item (256 at GQA 4): the prefix is read and transposed once
# per 8 tiles (cost model, trn2, Llama-3-8B layer: prefill 1k 998 -> 892 us, 1k over 8k 4986 ->
# 4422, chunked 512 over 4k 1490 -> 1354; 16 tiles: 1039 / 4408 / 1404)
QUERY_TILES_MAX = 8


def query_block(max_q_len: int, group: int, kv_heads: int = 1, head_dim: int = 128,
                cores: int = 1) -> int:
    """Query tokens per work item. While it fits one tile (128 // group tokens: group x Qb score
    rows per kv head), max_q_len rounded up to a power of two; beyond, as many whole tiles as
    the longest request fills (at most the largest power of two up to QUERY_TILES_MAX and to the
    tiles whose state fits ITEM_TILE_BYTES for its kv heads), so an item reads each chunk of keys
    (and pays each loop barrier) once for up to 8 x 128 // group queries, and a chunk of 96 or
    160 queries pays no padding tile (cost model, trn2, Llama-3-8B layer, LNC=1 / 2: twelve
    chunks of 96 over 1k keys 824.2 / 428.9 -> 653.4 / 342.5 us in 3 tiles instead of 4; two of
    160 over 900 266.8 / 136.8 -> 182.2 / 93.1 in 5 (LNC=2: 3) instead of 8 (4)). On ``cores``
    cores (LNC=2) the longest request keeps at least as many blocks as there are cores, so each
    core runs whole units of its own rather than both halves of one."""
    per_tile = max(1, 128 // group)
    qb = 1
    while qb < max_q_len:
        qb *= 2
    if qb <= per_tile:
        return qb
    head_tiles = -(-kv_heads // max(1, 128 // (group * per_tile)))
    fits = ITEM_TILE_BYTES // (6 * head_dim * head_tiles)
    most = 1
    while 2 * most <= min(QUERY_TILES_MAX, fits):
        most *= 2
    return min(most, -(-max_q_len // (per_tile * cores))) * per_tile


# What a launch of whole units costs, per unit of work (seconds; fitted by
# benchmarks/query_blocks.py on the chunked-prefill replays, trn2, Llama-3-8B layer): a score tile
# (128 rows) over a chunk of keys (VectorE and ScalarE passes), a chunk an item gathers (per byte
# of its K and V: 1.24x the DMA time at full bandwidth), and an item's fixed part (its queries,
# its state's finalize, its share of the loop barriers).
QB_TILE_CHUNK_S = 0.178e-6
QB_CHUNK_BYTE_S = 1.77e-6 / (2 * 128 * 8 * 128 * 2)
QB_ITEM_S = 3.86e-6
# Smaller items read a request's keys once each: a smaller block is taken only while the launch
# gathers at most this many times the keys of its step (the launch's requests and the step's
# decode requests beside; or no more than with the largest block, when that gathers more)
QB_GATHER_LIMIT = 1.05


QB_COSTS = (QB_TILE_CHUNK_S, QB_CHUNK_BYTE_S, QB_ITEM_S)


def prefill_query_block(prob, q_lens, paged_kv_cache, window_left, causal, cores: int = 1,
                        step_keys: int = None) -> int:
    """Query tokens per work item of a prefill launch: ``query_block``'s (as many tiles as the
    longest request fills), or half, a quarter ... of its tiles when that costs less
    (``pick_query_block``). Every item computes all its tiles, real query rows or padding, so
    a launch whose requests feed fewer tokens than its longest (a prompt's last chunk beside
    full ones) spends VectorE and ScalarE passes on padding rows; smaller items read their keys
    once per item instead (the step's gathers at most ``QB_GATHER_LIMIT`` times its keys,
    ``step_keys``: by default the launch's)."""
    geo = prob.geo
    top = query_block(int(q_lens.max(initial=0)), prob.group, geo.num_heads, geo.head_dim,
                      cores if dominant_request(q_lens, prob.kv_lens) else 1)
    candidates = query_block_candidates(top, prob.group)
    if len(candidates) == 1:
        return top
    kv_bytes = split_cache(paged_kv_cache)[0].dtype.itemsize

    def terms(qb):
        return query_block_terms(prob.table.indptr, prob.kv_lens, q_lens, qb, window_left, causal,
                                 geo.page_size, geo.num_heads, prob.group, geo.head_dim, kv_bytes)
    keys = int(prob.kv_lens.sum()) if step_keys is None else step_keys
    return pick_query_block(candidates, terms, keys)


def dominant_request(q_lens, kv_lens) -> bool:
    """Whether one request holds more than half a launch's work (queries x keys): under LNC=2
    its queries then come in at least two blocks (``query_block``'s ``cores``), so the cores
    share it as whole units; otherwise the cores share the requests' blocks, and halving every
    block would only read each request's keys twice (ten chunks of 64 queries over 100-1500
    keys: 1.67x the minimum bytes, 319.5 -> 253.1 us on trn2)."""
    work = np.asarray(q_lens, np.int64) * np.asarray(kv_lens, np.int64)
    return bool(work.size) and 2 * int(work.max()) > int(work.sum())


def query_block_candidates(top: int, group: int) -> list:
    """The blocks ``prefill_query_block`` weighs, largest first: ``top``, then the powers of two
    below its tiles of 128 // group queries (8, 4, 2, 1 tiles; 5, 4, 2, 1; 3, 2, 1), whole
    units only (a block of one tile, or a flat list's, is taken as is: the list is [top])."""
    per_tile = max(1, 128 // group)
    if top <= per_tile or not whole_units(top):
        return [top]
    out, tiles = [top], 1
    while 2 * tiles < top // per_tile:     # the largest power of two below top's tiles
        tiles *= 2
    while tiles >= 1 and whole_units(tiles * per_tile):
        out.append(tiles * per_tile)
        tiles //= 2
    return out


def query_block_terms(kv_indptr, kv_lens, q_lens, qb, window_left, causal, page_size, kv_heads,
                      group, head_dim, kv_bytes) -> np.ndarray:
    """[score tiles x chunks, bytes gathered, items, keys gathered] of requests of ``q_lens``
    queries over ``kv_lens`` keys in blocks of ``qb`` (what ``pick_query_block`` weighs)."""
    items = query_blocks(kv_indptr, kv_lens, q_lens, qb, window_left, causal, page_size)
    T = chunk_tokens(page_size)
    chunks = int((items.c1 - items.c0).sum())
    tiles = score_tiling(kv_heads, group, qb)[2]
    return np.array([tiles * chunks, chunks * 2 * T * kv_heads * head_dim * kv_bytes,
                     items.L.size, chunks * T], float)


def pick_query_block(candidates, terms, step_keys: int, costs=None) -> int:
    """The candidate (largest first) of least estimated cost, ``terms(qb)[:3] @ costs`` (default
    ``QB_COSTS``), among those whose gathers stay within ``QB_GATHER_LIMIT`` x ``step_keys``
    (or within the first's, when it gathers more); ``terms``: ``query_block_terms`` of a block."""
    costs = np.asarray(QB_COSTS if costs is None else costs, float)
    best, limit = None, None
    for qb in candidates:
        t = terms(qb)
        if limit is None:
            limit = max(QB_GATHER_LIMIT * step_keys, t[3])
        if t[3] > limit:                        # smaller blocks only gather more
            break
        cost = float(t[:3] @ costs)
        if best is None or cost < best[0]:
            best = (cost, qb)
    return best[1]


@dataclass(frozen=True)
class PrefillLaunch:
    """The kernel's arguments after the cache rows, and where each query token sits in the
    padded q (blocks of Qb rows per work item, zero rows past a request's last token)."""

    arrays: tuple
    statics: tuple
    gather: np.ndarray       # [padded rows] int64: the q row copied there, -1 for a zero row
    scatter: np.ndarray      # [Q] int64: the padded row of query token t
    kv_lens: np.ndarray      # [B] int64: each request's keys (from the page table)

    def pad_queries(self, q):
        """q's rows in their padded places, zeros elsewhere (a NumPy array or a torch tensor,
        gathered where it lives)."""
        keep = np.flatnonzero(self.gather >= 0)
        shape = (self.gather.size,) + tuple(q.shape[1:])
        if isinstance(q, np.ndarray):
            out = np.zeros(shape, q.dtype)
            out[keep] = q[self.gather[keep]]
            return out
        import torch
        on = lambda a: torch_index(a, q.device)    # noqa: E731
        out = q.new_zeros(shape)
        out[on(keep)] = q[on(self.gather[keep])]
        return out

    def unpad(self, rows):
        """Query token t's row of a padded kernel output (NumPy or torch)."""
        if isinstance(rows, np.ndarray):
            return rows[self.scatter]
        import torch
        return rows[torch_index(self.scatter, rows.device)]


def plan_prefill(prob, q_lens, qo_indptr, paged_kv_cache, causal,
                 logits_soft_cap, window_left, sinks, k_scale, v_scale, cores,
                 masks=None, step_keys=None) -> PrefillLaunch:
    """Checked inputs (``prob``, ``q_lens``; ``masks``: each request's custom mask, or None)
    -> work items, padded row maps, kernel arguments (``step_keys``: the keys of the whole
    step this launch is part of, ``prefill_query_block``)."""
    qb = prefill_query_block(prob, q_lens, paged_kv_cache, window_left, causal and masks is None,
                             cores, step_keys)
    items = query_blocks(prob.table.indptr, prob.kv_lens, q_lens, qb, window_left,
                         causal and masks is None, prob.geo.page_size)
    if masks is not None:
        items = with_mask_free_chunks(items, masks, qb, prob.geo.page_size)
    n_items = items.L.size
    # blocks of queries end their units in tails; one query per item (decode) in late ones
    tails = _tails(prob, paged_kv_cache, qb) and (qb > 1 or masks is None)
    if tails and qb == 1:
        tails = LATE_TAILS
    unit_tail, lead_sizes = _unit_tail(prob, paged_kv_cache, masks, qb, causal and masks is None,
                                       items)
    if unit_tail:                      # (causal, no custom mask) tiles score their diagonal
        items = right_aligned(items, q_lens, qb)
    # items of one tile of query rows (a decode step, or verification's drafts, a tree's too): a
    # static pass when the loops would cost more; decode's requests without a mask share tiles
    pack = _pack(prob, paged_kv_cache, bucket(n_items), cores) if qb == 1 and masks is None else 1
    one_tile = qb <= 128 // prob.group and not whole_units(qb)
    chunks = (static_pass(items, prob.geo.page_size, bucket(n_items), cores, host_nc_version(),
                          _chunk_bytes(prob, paged_kv_cache),
                          _row_bytes(prob, paged_kv_cache, qb), pack)
              if one_tile else 0)
    # (whole units and static passes take no null items past the launch's rows, only a row
    # past them or the bucket's empty rows: a custom mask is no bar)
    null = null_items(prob.geo, prob.table, bucket(n_items) * qb,
                      None if whole_units(qb) or chunks else masks)
    static, lead = (), 0
    item_rows = np.arange(n_items)                 # the padded block of each item
    if chunks:
        work, static, item_rows = _static_plan(items, prob.geo.page_size, bucket(n_items),
                                               chunks, null, cores, pack, qb)
    else:
        mm_bytes = _matmul_dtype(split_cache(paged_kv_cache)[0].dtype)[1]
        tiles, rows = score_tiling(prob.geo.num_heads, prob.group, qb)[2:]
        group = whole_group_units(tiles, rows, prob.geo.head_dim, mm_bytes, host_nc_version(),
                                  bucket_floor(bucket(n_items)) // cores)
        lead = lead_units(bucket(n_items), cores, whole_units(qb), group)
        raised = (launch_lead(lead, bucket(n_items), cores, n_items)
                  if lead_mode() == "launch" else lead)
        if raised > lead:          # (the kernel's groups follow its lead: its
            lead = raised          # whole_units_per_iteration)
            group = whole_group_units(tiles, rows, prob.geo.head_dim, mm_bytes,
                                      host_nc_version(), lead)
        work = split_work(items, prob.geo.page_size, bucket(n_items), cores,
                          items_per_iteration(qb, item_query_bytes(
                              prob.geo.num_heads * prob.group, qb, prob.geo.head_dim, mm_bytes)),
                          table_capacity(prob.geo, prob.table), 1 if qb == 1 else bucket(n_items),
                          whole_units(qb), null, tails, unit_tail, group, tiles, lead,
                          lead_sizes, functools.partial(tail_programs.choose, scope=(
                              prob.geo.num_heads, prob.group, prob.geo.head_dim,
                              str(split_cache(paged_kv_cache)[0].dtype), window_left, causal)))
    # item k covers tokens q0 .. q0 + qb of its request, at padded rows k*qb .. (rows before
    # first_row: padding)
    tok = items.q0[:, None] + np.arange(qb)[None, :]
    real = tok < q_lens[items.request][:, None]
    if items.first_row is not None:
        real &= np.arange(qb)[None, :] >= items.first_row[:, None]
    gather = np.full((bucket(n_items), qb), -1, np.int64)
    gather[item_rows] = np.where(real, qo_indptr[items.request].astype(np.int64)[:, None] + tok,
                                 -1)
    gather = gather.reshape(-1)
    scatter = np.empty(int(q_lens.sum()), np.int64)
    scatter[gather[gather >= 0]] = np.flatnonzero(gather >= 0)
    row_tab = None if qb == 1 else (np.arange(prob.group * qb) // prob.group).astype(
        np.int32).reshape(-1, 1)
    mask_bits = (None if masks is None else
                 mask_table(masks, items, qb, gather.size, prob.geo.page_size, item_rows))
    arrays, statics = kernel_arguments(prob, paged_kv_cache, work, row_tab,
                                       sinks, soft_cap(logits_soft_cap), k_scale, v_scale,
                                       mask_bits, static, window_left,
                                       unit_tail, lead)
    return PrefillLaunch(arrays, statics, gather, scatter, prob.kv_lens)


@dataclass(frozen=True)
class PrefillPart:
    """One launch of a prefill step: the q rows it takes (None: all, in order), its plan, and
    whether it carries the step's fused K/V write."""

    rows: object
    launch: PrefillLaunch
    writes: bool


def prefill_parts(prob, q_lens, qo_indptr, paged_kv_cache, causal,
                  logits_soft_cap, window_left, sinks, k_scale, v_scale, cores,
                  masks=None) -> list:
    """The launches of a prefill step (``PrefillPart``), planned (everything checked) before the
    first runs; the NumPy entry and the torch device path both run these. A call identical to
    a recent one in all but the cache's contents (the next layer of the same step) is handed
    that call's plan (``plan_cache``)."""
    return plan_cache.reused(_prefill_parts, (prob, q_lens, qo_indptr, paged_kv_cache, causal,
                                              logits_soft_cap, window_left, sinks, k_scale,
                                              v_scale, cores, masks), (3,))


def _prefill_parts(prob, q_lens, qo_indptr, paged_kv_cache, causal,
                   logits_soft_cap, window_left, sinks, k_scale, v_scale, cores,
                   masks=None) -> list:
    """``prefill_parts`` planned afresh.

    One launch, unless the batch mixes requests of one query with longer ones: then the longer
    requests run first, with the whole fused write, and the single queries after them as decode
    (Qb = 1), since blocks of Qb rows would cost a decode request Qb x the tiles. The cost model
    prices the split below one launch on the serving traces (chunked prefill of 128 beside
    decode, Llama-3-8B layer, trn2: 3.7 ms against 7.2 ms per step; docs/performance.md)."""
    options = (paged_kv_cache, bool(causal), logits_soft_cap, window_left, sinks, k_scale,
               v_scale, cores)
    single = q_lens == 1
    if not (single.any() and (q_lens > 1).any()):
        return [PrefillPart(None, plan_prefill(prob, q_lens, qo_indptr, *options, masks), True)]
    parts = []
    for group, writes in ((~single, True), (single, False)):
        idx = np.flatnonzero(group)
        rows, qo = _sub_queries(idx, qo_indptr)
        sub = dataclasses.replace(prob, batch=idx.size, table=prob.table.requests(idx))
        sub_masks = None if masks is None else [masks[i] for i in idx]
        parts.append(PrefillPart(rows, plan_prefill(sub, q_lens[idx], qo, *options, sub_masks,
                                                    int(prob.kv_lens.sum())), writes))
    return parts


def _sub_queries(idx, qo_indptr):
    """The query rows of requests ``idx`` (int64) and their qo_indptr as a batch of its own."""
    q0, q1 = qo_indptr[idx].astype(np.int64), qo_indptr[idx + 1].astype(np.int64)
    rows = np.concatenate([np.arange(a, b) for a, b in zip(q0, q1)] + [np.zeros(0, np.int64)])
    return rows, np.concatenate([[0], np.cumsum(q1 - q0)]).astype(np.int32)
