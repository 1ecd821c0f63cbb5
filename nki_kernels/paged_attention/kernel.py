"""Attention over a paged KV cache as an NKI kernel (online softmax over KV chunks): batch decode,
and blocks of query tokens per request (speculative verification, chunked prefill).

Dimensions:  B query rows (work items x Qb; a bucket: rows past the real ones are padding),
    HQ query heads, H kv heads, G = HQ / H, D head_dim (<= 512), T chunk tokens,
    Qb query tokens per work item (1 for decode)
Args (device):
    q: [B, HQ, D] @ HBM (fp32 / fp16 / bf16); a work item's queries are rows OUT..OUT+Qb
    k_rows, v_rows: the cache as rows of D elements [R, D] @ HBM (v_rows None for a fused cache:
        V rows sit ``v_rows_offset`` rows after K rows)
    meta: [rows, META_COLS] int32 work items (work.py): a unit (request, or block of its
        queries) over one kind of chunk range (work.ITEM_CLASSES: no keys, one masked chunk, or
        a mask-free block of 32, 16, ..., 1 chunks): kv_indices start, keys end and window start
        of the unit, the item's chunk bounds and where its first chunk starts, first query row,
        each query row's causal bound and window span, and the softmax-state slots it chains
        through (LOAD, STORE); spans: [cores, work.span_cols(U)] int32, the rows each core runs
        per kind and loop width, and the split unit's slot and output row (LNC=2); whole units:
        [cores, work.WHOLE_UNIT_SPAN_COLS], the core's units, its part of the split one and
        whether there is one; a static pass: its token slots' cache rows, [T, rows * chunks]
        int32 (work.static_slot_rows)
    kv_indices: [>= pages + T, 1] int32 (padded)
    tok_tab: [T, 2] int32 (page slot, entry of chunk-local token t)
    row_tab: [G*Qb, 1] int32, the query token (r // G) of a kv head's score row r, or None
        (Qb = 1); sinks: [HQ, 1] fp32 or None
    mask_bits: [B * C, ceil(T / 8)] uint8 custom-mask table (kernel_mask.py), or None
    static: kv heads, page size, row strides, a token's K (or V) pattern (access_patterns
        PagedKVLayout.token), scale = sm_scale * k_scale, soft_cap, v_scale,
        matmul dtype: shapes and model constants only, so one compile serves every step of a
        shape bucket; static_pass: () (device loops) or (chunks, full) (a static pass of
        ``chunks`` slots a row, the first ``full`` of them every token a key in every row with
        keys, work.static_full_slots; one compile per pair); windowed: whether any request may
        have a sliding window (False: every window start is 0, and no mask checks it);
        unit_tail: a whole unit's tail slots (0: none; causal launches: work.with_unit_tail
        made their rows)
        lead_units: whole units the launch is sure to hold (work.lead_units): their groups
        run without a device loop
Returns out [B, HQ, D] (q dtype) and lse [B, HQ, 1] fp32, base 2, @ shared HBM.

Control flow is on the device: one loop per kind of work item and width (U items per iteration,
then U/2, ..., 1 for the remainder), trip counts read from ``spans`` by ``nisa.scalar_load``; the
body of a kind is that kind's static program (a block of 32 chunks: 32 chunks of straight-line
code). No loop runs per request, so a step pays a loop barrier per U items, not per request and
kind of chunk, and the program size does not grow with batch or length. A unit's softmax state
(fp32 [rows, D + 2]: -max, sum, acc) chains from item to item through an HBM scratch: an item of a
kind with at most one item per unit (work.chains_in) starts from the state its unit's earlier
items left in slot LOAD (the identity for its first item), loaded with its setup; the others fold
their chunks into a fresh state and merge slot LOAD in at their end. Each keeps the result in slot
STORE and writes the unit's output (rewritten by the unit's later items). Null items (work.NullItems)
pad a kind's last iteration: every access of theirs is past its tensor and skips. A small bucket
may run a static pass instead (``static_pass`` = (chunks, full), work.static_pass): no device
loop, each row one masked item of ``chunks`` chunks, written once; its token slots' cache rows
come from the host (``spans`` holds them then, work.static_slot_rows), its rows' queries and
masks are made a few rows ahead in the pipeline, each gather's K goes one gather ahead of its V
(kernel_items.k_first), and a decode pass packs requests into one tile
of score rows (work.static_pack: four Llama-3-8B requests fill 128 partitions; each request's
scores are written at its own partition offset, so nothing crosses requests). With
``kernel[2]`` (LNC=2) each program instance runs the items of its own units and of its part of
the one unit split between the two (the host cuts the
step's chunks into equal halves, work.decode_work); the two parts' states are exchanged with
``nisa.sendrecv`` and merged, and program 0 writes that unit.
Blocks of more than work.FLAT_LIST_MAX_QUERIES queries (chunked prefill) run as whole units instead
(work.whole_units): one loop over the core's units, each folding all its chunks in loops nested
in it (masked chunks two at a time, mask-free ones in blocks of 32, 16, ..., 1), its state in
SBUF from first chunk to output: a prefill block's state (4 MB at 8 kv heads, D 128) chained
through HBM per kind of chunk range would move more bytes than its keys.
Tiling per work item: tiles of score rows, each a group of kv heads and Qt = min(Qb, 128 // G)
of the item's query tokens (rows R = heads x G x Qt <= 128 on partitions, kv head j's rows
ordered (query token, g); each row masked to its own keys; the tiles of one step share the
chunk's K^T per kv head and its V): scores[R, T]
accumulate one matmul per head in PSUM fp32 (stationary = that head's qT zero-padded to R columns,
moving = K^T: gathered transposed on NeuronCore-v3+ when K is 2-byte NHD with D <= 128
(kernel_load.kt_dma_layout), else made on TensorE, D > 128 in 128-row K-tiles), one online softmax for the whole group
(VectorE max, ScalarE exp with fused row sum, running rescale), and P @ V per head as
(V_j stationary, head j's columns of P^T moving) into head j's columns of a [D, R] PSUM tile,
transposed back once per step. Whole units keep their tiles' states side by side (one
``state_bank``): the one-element statistics (running max, rescale, row sums) of up to 8 tiles of
a step take one instruction each, all tiles are finalized at once, and on NeuronCore-v3+ P^T
comes by DMA transpose (no TensorE transpose, no ScalarE eviction), the softmax step's end
lagging its begin by a few units (kernel_items.end_lag). Each item is software-pipelined in
program order (gathers two steps ahead, scores up to 8 tiles ahead, the cache rows of a whole
block of chunks made up front), so every engine has the next step's work queued while the
current one finishes.
"""

from __future__ import annotations

from nki_kernels.backend import nki, nisa, nl
from nki_kernels.kernel_dtypes import dtype_bytes
from nki_kernels.launch_options import program_cores
from nki_kernels.paged_kv_append.kernel import scatter_rows

from .kernel_cursor import Geometry, partition_iota, query_of_row
from .kernel_items import (PREP_AHEAD, SCORES_AHEAD, batched_chunks, finish, fold_items,
                           first_chunks, fold_shape, gathered, item_queries, item_row, k_first,
                           loader, merge_split, prepare, static_block, static_block_keep,
                           static_block_rows, static_rows, unit, unit_group_begin,
                           unit_group_fold, unit_group_setup, unit_loops, write)
from .kernel_load import (PSUM_BANK_BYTES, ROW_LIMIT, group_entry_rows, kt_dma_layout,
                          zero_rows)
from .kernel_mask import custom_mask
from .kernel_queries import query_pads, query_rows
from .kernel_softmax import load_state, state_tile
from .work import (CHUNK_BLOCKS, ITEM_CLASSES, META_COLS, NEXT, TAIL_CHUNKS, chains_in,
                   flat_sizes, item_query_bytes, items_per_iteration, lead_groups, loop_widths,
                   score_tiling, section_pack, span_column, span_start, split_slot, starts_fresh,
                   state_slots, static_core_rows, static_pack, unit_bodies, whole_group_units,
                   whole_units)


def whole_units_per_iteration(st):
    """Whole units the first loop iteration of ``run_whole_units`` takes
    (``work.whole_group_units``, which the host's rounds follow)."""
    return whole_group_units(len(st.tiles), st.R, st.D, dtype_bytes(st.mm_dtype),
                             3 if nisa.get_nc_version() >= nisa.nc_version.gen3 else 2,
                             st.lead_units)


# Mask-free chunks of a work item come in blocks of work.CHUNK_BLOCKS: a block of 32 chunks (4096
# tokens) is one item, so a loop iteration of U items carries enough work to hide its barrier
# (~9 us, nki_kernels/profile) and pipeline fill (benchmarks/loop_blocks.py has the sweep).


@nki.jit
def batch_decode_kernel(q, k_rows, v_rows, meta, spans, kv_indices, tok_tab, row_tab, sinks,
                        mask_bits, num_kv_heads, page_size, strides, token_pattern, scale, soft_cap,
                        v_scale, mm_dtype, static_pass=(), windowed=True, unit_tail=0,
                        lead_units=0, tail_profile=()):
    return attention(q, k_rows, v_rows, meta, spans, kv_indices, tok_tab, row_tab, sinks,
                     mask_bits, num_kv_heads, page_size, strides, token_pattern, scale, soft_cap,
                     v_scale, mm_dtype, static_pass, windowed, unit_tail, lead_units, tail_profile)


@nki.jit
def append_attention_kernel(q, k_rows, v_rows, key, value, slots, counts, quant, write, meta, spans,
                            kv_indices, tok_tab, row_tab, sinks, mask_bits, num_kv_heads, page_size,
                            strides, token_pattern, scale, soft_cap, v_scale, mm_dtype,
                            static_pass=(), windowed=True, unit_tail=0, lead_units=0,
                            tail_profile=()):
    """Fused write: the step's new K/V rows are scattered into the cache first, then attention
    reads them with the rest, in one launch. ``key``, ``value``, ``slots``, ``counts``, ``quant``
    and ``write`` = (token pattern, V offset, cache row elements, quantization limit) are
    paged_kv_append.kernel's arguments over the same cache, viewed there as rows of a page
    entry's elements (wider rows are quantized on write when ``quant`` is given); ``write``'s
    last item: the packed K+V write's parts (0: one write per K and V). Under LNC=2
    one core writes K and the other V (a fused cache of four tiles or more: the tiles in turns,
    K and V paired), and both meet at a core barrier on each written tensor before reading."""
    write_pattern, v_offset, row_elems, limit, parts = write
    D = q.shape[2]
    k_entries = k_rows.reshape((k_rows.shape[0] * D // row_elems, row_elems))
    v_entries = (None if v_rows is None else
                 v_rows.reshape((v_rows.shape[0] * D // row_elems, row_elems)))
    scatter_rows(k_entries, v_entries, key, value, slots, counts, write_pattern, v_offset, quant,
                 limit, parts)
    if program_cores() == 2:
        for t in (k_rows,) if v_rows is None else (k_rows, v_rows):
            nisa.core_barrier(data=t, cores=(0, 1))
    return attention(q, k_rows, v_rows, meta, spans, kv_indices, tok_tab, row_tab, sinks,
                     mask_bits, num_kv_heads, page_size, strides, token_pattern, scale, soft_cap,
                     v_scale, mm_dtype, static_pass, windowed, unit_tail, lead_units, tail_profile)


class Step(nl.NKIObject):
    """What every work item of one launch reads: the arguments (q, the cache sources, the work
    table ``meta``, page list, sinks, the outputs), the static geometry (``Geometry``; query
    tokens per item Qb and per tile Qt, score rows R per tile, the tiles as (first kv head, kv
    heads, first query token)), the step-wide tiles (token table, row tables, iota) and the
    model constants. Built once by ``make_step``; its fields never change."""




def attention(q, k_rows, v_rows, meta, spans, kv_indices, tok_tab, row_tab, sinks, mask_bits,
              num_kv_heads, page_size, strides, token_pattern, scale, soft_cap, v_scale, mm_dtype,
              static_pass=(), windowed=True, unit_tail=0, lead_units=0, tail_profile=()):
    """The kernel's body (arguments as above): returns out, lse."""
    st = make_step(q, k_rows, v_rows, meta, kv_indices, tok_tab, row_tab, sinks, mask_bits,
                   num_kv_heads, page_size, strides, token_pattern, scale, soft_cap, v_scale,
                   mm_dtype, static_pass, windowed, unit_tail, lead_units, tail_profile)
    if static_pass:
        st.slot_rows = spans           # no loops: the pass's token slots' cache rows instead
        run_static_pass(st, static_pass)
        return st.out, st.lse
    span = nl.ndarray((1, spans.shape[1]), nl.int32, buffer=nl.sbuf, name="span")
    nisa.dma_copy(dst=span, src=spans[st.p:st.p + 1, :])
    if st.whole:
        run_whole_units(st, span)
    else:
        run_item_loops(st, span, spans.shape[1])
    return st.out, st.lse


def score_tiles(H, Qb, Qt, per_group, pack=1):
    """The tiles of score rows (first kv head, kv heads, first query token of the block): every
    tile of a chunk's step shares its K^T per kv head and its V. ``pack`` requests a tile
    (``packed_requests``): one tile of their pack * H kv heads, request r's head j the tile's
    (virtual) head r * H + j, its query and output rows r * HQ + j * G + g of the first."""
    if pack > 1:
        return [(0, pack * H, 0)]
    tiles = []
    for h0 in range(0, H, per_group):
        for q0 in range(0, Qb, Qt):
            tiles.append((h0, min(per_group, H - h0), q0))
    return tiles


def packed_requests(B, Qb, H, G, static_pass, indirect, page_size, k_dtype, mask_bits,
                    mm_dtype):
    """Requests a tile of score rows holds (``work.static_pack``): several in a decode static
    pass on the indirect path (each its own gathers; no custom mask, no V converted per chunk),
    else 1."""
    convert_v = k_dtype == nl.float8_e4m3fn and nisa.get_nc_version() < nisa.nc_version.gen4
    if (not static_pass or Qb != 1 or not indirect or page_size > 128 or convert_v
            or mask_bits is not None):
        return 1
    pack = static_pack(static_core_rows(B, program_cores()), H, G, dtype_bytes(mm_dtype))
    if len(static_pass) > 2:           # sections: a pack that divides each one's rows
        sizes = []
        for section in static_pass[2]:
            sizes.append(section[0])
        pack = section_pack(pack, sizes)
    return pack


def make_step(q, k_rows, v_rows, meta, kv_indices, tok_tab, row_tab, sinks, mask_bits,
              num_kv_heads, page_size, strides, token_pattern, scale, soft_cap, v_scale, mm_dtype,
              static_pass=(), windowed=True, unit_tail=0, lead_units=0, tail_profile=()):
    """The launch's ``Step``: geometry and tiling, outputs, step-wide tiles and, for a flat list
    of items in device loops, the HBM scratch of softmax states with its identity slot."""
    B, HQ, D = q.shape
    H, G = num_kv_heads, HQ // num_kv_heads
    Qb = 1 if row_tab is None else row_tab.shape[0] // G      # query tokens per work item
    Qt, per_group = score_tiling(H, G, Qb)[:2]     # query tokens, kv heads per tile
    assert Qb % Qt == 0, f"{Qb} query tokens per item is not a whole number of tiles of {Qt}"
    T = tok_tab.shape[0]
    rpp, es, v_rows_offset = strides
    indirect = nisa.get_nc_version() >= 3 and k_rows.shape[0] < ROW_LIMIT
    geo = Geometry(T, page_size, rpp, es, D, H, token_pattern,
                   kt_dma_layout(indirect, k_rows.dtype, mm_dtype, T, D, H, es, token_pattern))
    sources = ((k_rows, 0), (k_rows, v_rows_offset * D) if v_rows is None else (v_rows, 0))
    out = nl.ndarray((B, HQ, D), q.dtype, buffer=nl.shared_hbm, name="out")
    lse = nl.ndarray((B, HQ, 1), nl.float32, buffer=nl.shared_hbm, name="lse")
    # a static pass on the indirect path gathers from the host's rows: no cursor, no entry rows
    host_rows = bool(static_pass) and indirect and page_size <= 128
    tok_sb = None
    if not host_rows:
        tok_sb = nl.ndarray((T, 2), nl.int32, buffer=nl.sbuf, name="tok_tab")
        nisa.dma_copy(dst=tok_sb, src=tok_tab)
    GQ = G * Qt                                            # score rows per kv head and tile
    pack = packed_requests(B, Qb, H, G, static_pass, indirect, page_size, k_rows.dtype, mask_bits,
                           mm_dtype)
    tiles = score_tiles(H, Qb, Qt, per_group, pack)
    R = tiles[0][1] * GQ
    row_q = []                     # per tile of query tokens (q0 = j * Qt): its rows' tokens
    if Qb > 1:
        for q0 in range(0, Qb, Qt):
            row_q.append(query_of_row(row_tab, R, GQ, q0 * G))
    iota_rt = nl.ndarray((R, T), nl.int32, buffer=nl.sbuf, name="iota_rt")
    nisa.iota(dst=iota_rt, pattern=[[1, T]], offset=0, channel_multiplier=0)
    # Blocks of queries (prefill, verification) evict their scores on VectorE with the mask and
    # row max in one pass (kernel_softmax.chunk_scores), ScalarE being their busiest engine;
    # decode keeps the ScalarE eviction, VectorE being its busier one. keep_all: a mask-free
    # chunk's predicate, every score kept.
    keep_all = None
    if soft_cap <= 0 and Qb > 1:
        keep_all = nl.ndarray((R, PSUM_BANK_BYTES // 4), nl.uint8, buffer=nl.sbuf,
                              name="keep_all")
        nisa.memset(dst=keep_all, value=1, engine=nisa.engine.gpsimd)
    # OCP fp8 (e4m3fn) is a matmul input from NeuronCore-v4 only: V is converted per chunk before.
    convert_v = k_rows.dtype == nl.float8_e4m3fn and nisa.get_nc_version() < nisa.nc_version.gen4
    v_dtype = mm_dtype if convert_v else None
    mask = custom_mask(mask_bits, B, R)
    st = Step(q=q, meta=meta, kv_indices=kv_indices, sinks=sinks, out=out, lse=lse, geo=geo,
              sources=sources, G=G, D=D, T=T, Qb=Qb, Qt=Qt, GQ=GQ, R=R, tiles=tiles, row_q=row_q,
              tok_sb=tok_sb, windowed=windowed, block_t=None, slot_rows=None, slot_col=None,
              q_pool=0, pack=pack, consts=(geo, sources, iota_rt, indirect, v_dtype, mask, Qt, G,
                      zero_rows(T, H * D, k_rows.dtype) if geo.kt_dma else None),
              indirect=indirect, v_dtype=v_dtype, page_size=page_size,
              blocked=page_size <= 128,    # mask-free blocks of whole pages: several tokens a partition
              k_bytes=dtype_bytes(k_rows.dtype), scale=scale, soft_cap=soft_cap,
              v_scale=v_scale, mm_dtype=mm_dtype, whole=whole_units(Qb), lead_units=lead_units,
              # whole units' tail slots (``work.with_unit_tail``), per body (``work.tail_profile``)
              unit_tail=unit_tail if whole_units(Qb) else 0,
              tail_profile=tail_profile if whole_units(Qb) and unit_tail else (),
              # a static pass's leading slots that skip no row (their V needs no zeroing)
              full_slots=static_pass[1] if static_pass else 0,
              p=nl.program_id(0), cores=program_cores(), entry_rows={}, scratch=None,
              keep_all=keep_all, mask=mask, q_pads=None, later=None,
              exp_scale=float(scale) if keep_all is not None else 1.0,
              iota_t=partition_iota(T),
              # blocks of queries: the running max's copy on GpSimd (VectorE is their busiest
              # engine); decode keeps it on VectorE (GpSimd makes its gathers' descriptors)
              state_copy_engine=nisa.engine.gpsimd if Qb > 1 else None,
              group=state_group(whole_units(Qb), keep_all is not None, tiles),
              # blocks of queries on NeuronCore-v3+ transpose P by DMA (2-byte matmul dtype):
              # whole units' DMA engines are idle; verification items since their tails gather
              # in fewer loops (eight verification steps, trn2: 5% less in all, 16 x 4 drafts
              # x 1k 3% more, its gathers binding); decode keeps TensorE
              dma_pT=(Qb > 1 and nisa.get_nc_version() >= nisa.nc_version.gen3
                      and dtype_bytes(mm_dtype) == 2),
              # flat-list items set their states in their first softmax step (no identity
              # memsets); NeuronCore-v2 adds a poison term to the state before any step
              first_init=(not whole_units(Qb)
                          and nisa.get_nc_version() >= nisa.nc_version.gen3))
    assert not st.unit_tail or (st.indirect and st.blocked and mask is None), (
        f"unit_tail={unit_tail}: tails need indirect gathers, pages <= 128, no custom mask (work.unit_tail_chunks)")
    if st.unit_tail:                   # the tails' token columns (the longest tail's)
        block_columns(st, max([st.unit_tail] + list(flat_sizes(st.tail_profile))))
    if st.blocked and st.indirect and not host_rows:   # by f"{group}" (NKI dict keys: strings)
        groups = []
        for size in CHUNK_BLOCKS:
            groups.append(gathered(st, size))
        for g in range(1, max(groups) + 1):
            if g in groups:
                st.entry_rows[f"{g}"] = group_entry_rows(tok_tab, geo, g)
    # the scratch's identity slot first: its DMA's latency then hides behind the memsets below
    if not st.whole and not static_pass:
        units = B // Qb
        st.scratch = nl.ndarray((state_slots(units), len(tiles) * R, D + 2), nl.float32,
                                buffer=nl.private_hbm, name="states")
        identity = state_slots(units) - 1
        start = state_tile(R, D)
        for t in range(len(tiles)):
            nisa.dma_copy(dst=st.scratch[identity, t * R:(t + 1) * R, :], src=start)
        if st.cores == 2:      # this core's part of the split unit starts as the identity too
            part = split_slot(units, st.p)
            for t in range(len(tiles)):
                nisa.dma_copy(dst=st.scratch[part, t * R:(t + 1) * R, :], src=start)
    # blocks of queries: the zero-padded query stationaries of the item slots of an iteration,
    # zeroed once here (tiles of several kv heads only: one head's stationary has no padding),
    # for as many slots as a kind's loop over the core's share of the bucket's units fills (a
    # further slot, of a kind that repeats per unit or a core given more units, zeroes its
    # own). Measured (trn2): verify 16 x 4 drafts x 1k 670 -> 627 us; decode keeps a memset
    # per item (its pads are 4x narrower, and a short launch waits for the slots' memsets:
    # 1 x 512 30 -> 36 us)
    if per_group > 1 and Qb > 1:
        st.q_pads = {}
        engines = (nisa.engine.gpsimd, nisa.engine.vector)
        slots = whole_units_per_iteration(st) if st.whole else flat_items(q, Qb, mm_dtype)
        for slot in range(min(slots, -(-(B // Qb) // program_cores()) + 1)):
            for t in range(len(tiles)):
                st.q_pads[f"{slot},{t}"] = query_pads(tiles[t][1], tiles[t][1] * GQ, D,
                                                      mm_dtype, engines[len(st.q_pads) % 2])
    return st


# Tiles of score rows whose one-element softmax statistics (running max, rescale factor, row
# sums) take one instruction per group instead of one per tile (whole units: their states are
# one ``state_bank``); at most SCORES_AHEAD, the tiles whose scores are made ahead.
STATE_GROUP = SCORES_AHEAD


def state_group(whole, row_max, tiles):
    """Tiles per group of softmax statistics: STATE_GROUP (or all tiles, when fewer) for whole
    units whose scores come with their row max (no soft cap) and whose tiles all have the same
    rows; 1 (one tile at a time) otherwise."""
    if not whole or not row_max or len(tiles) < 2:
        return 1
    for tile in tiles:
        if tile[1] != tiles[0][1]:
            return 1
    return min(STATE_GROUP, len(tiles))


def run_whole_units(st, span):
    """Large blocks of queries: loops over the core's whole units, up to four an iteration (set
    up, their tails folded as one pipeline, then each unit's loops), then two, then one for the
    rest, each written when complete;
    under LNC=2 then, when the step is one unit, the core's part of it, merged with the other
    core's. A bucket of one unit runs it without the loop; under LNC=2 one of two, each core
    its own (the host gives each core one, an empty one if need be)."""
    def whole_unit(i):
        item = unit(st, i)
        write(st, item.states, item.b, item.bank)
    def split_unit(_):
        item = unit(st, nisa.scalar_load(span[0:1, 2:3]), diagonal=False)
        merge_split(st, item.states, item.b, item.bank)
    if st.q.shape[0] // st.Qb == 1:    # a bucket of one unit: no loop (one loop barrier less)
        if st.cores == 2:              # the unit split between the cores (work.split_work)
            split_unit(0)
        else:
            whole_unit(nisa.scalar_load(span[0:1, 0:1]))
        return
    if st.cores == 2 and st.q.shape[0] // st.Qb == 2:    # one unit each (work.split_work)
        whole_unit(nisa.scalar_load(span[0:1, 0:1]))
        return
    per = whole_units_per_iteration(st)
    if st.unit_tail and st.v_dtype is None:
        st.later = []                  # tails gather K ahead of V (kernel_items.k_first)

    def make_group(n, slots):      # n units an iteration: one barrier, tails pipelined
        def unit_group(i):
            units, taken = unit_group_begin(st, i, n, slots)
            for item in units:
                unit_loops(st, item, taken)
                write(st, item.states, item.b, item.bank)
        return unit_group
    # each body's tail slots per unit position (work.tail_profile), else the launch's
    profile = list(st.tail_profile)
    while len(profile) < unit_bodies(st.lead_units, per):
        profile.append(st.unit_tail)
    first, end = nisa.scalar_load(span[0:1, 0:1]), nisa.scalar_load(span[0:1, 1:2])
    lead = lead_groups(st.lead_units, per)
    body = 0
    # the groups the bucket guarantees: no loop, so no barrier and no fill between them; a
    # group's outputs are written after the next group's setup (whose DMAs then go first)
    done = []
    for g in range(len(lead)):
        items, tails, sizes = unit_group_setup(st, first, lead[g], profile[body])
        for item in done:
            write(st, item.states, item.b, item.bank)
        units, taken = unit_group_fold(st, items, tails, sizes)
        for item in units:
            unit_loops(st, item, taken)
        done = units
        first = first + lead[g]
        body = body + 1
    for item in done:
        write(st, item.states, item.b, item.bank)
    while per > 1:                 # groups of per units, then of half as many (at most one)
        grouped = first + ((end - first) // per) * per
        nl.fori_loop(first, grouped, make_group(per, profile[body]), step=per)
        first = grouped
        per = per // 2
        body = body + 1
    nl.fori_loop(first, end, make_group(1, profile[body]))
    if st.cores == 2:          # the split unit, when there is one (a single unit): 0 or 1 trip
        nl.fori_loop(0, nisa.scalar_load(span[0:1, 3:4]), split_unit)


def run_static_pass(st, static):
    """A small bucket without device loops (``work.static_pass``; ``static`` = (chunks, full
    slots), in sections also ((rows a core, chunks, full slots) of each)): every row of the
    launch is one item of ``chunks`` masked chunks (a request's chunks from its first, the ones
    past its keys read nothing), all of them one static iteration; each item writes its output
    once, so no state goes through HBM. No loop barrier, no pipeline fill per kind of item.
    Under LNC=2 each core takes half the rows; a bucket of one row is split
    (``work.static_split``): core p folds table row p, the request's chunk slots from c0 + p *
    chunks, and the two states are merged (``merge_split``: one exchange), program 0 writing
    the output. In sections (``work.static_sections``) a core's rows of each section take its
    chunk slots, one section's pipeline after the other's."""
    chunks = static[0]
    rows = st.q.shape[0] // st.Qb
    block_columns(st, chunks)
    if static_block(st, True, chunks) and st.v_dtype is None:
        st.later = []                  # K gathered one chunk ahead of V (kernel_items.k_first;
                                       # a V converted as it loads is gathered with its K)
    if len(static) > 2:
        run_static_sections(st, rows, static[2])
    elif st.cores == 2 and rows >= 2:
        half = static_core_rows(rows, st.cores)
        items_iteration(st, chunks, True, half, False)(st.p * half)
    elif st.cores == 2:
        item = items_iteration(st, chunks, True, 1, False, last_kept=True)(st.p)
        merge_split(st, item.states, item.b, item.bank)
    else:
        items_iteration(st, chunks, True, rows, False)(0)


def run_static_sections(st, rows, sections):
    """``run_static_pass``'s sections on each core, in order: its rows of each (``sections``:
    (rows a core, chunks, full slots) each), their cache rows' columns back to back (a core's
    rows' slots, ``work.static_slot_rows``)."""
    half = static_core_rows(rows, st.cores)
    per_core = 0
    for k in range(len(sections)):
        per_core += sections[k][0] * sections[k][1]
    first, col = st.p * half, st.p * per_core
    block_t = st.block_t
    for k in range(len(sections)):
        size, count, full = sections[k]
        st.slot_col, st.full_slots = col, full
        st.block_t = block_t[:, 0:count * st.T]
        items_iteration(st, count, True, size, False)(first)
        first, col = first + size, col + size * count


def flat_items(q, Qb, mm_dtype):
    """Items per iteration of the flat list's loops (``work.items_per_iteration``, as the host
    planned them for these queries)."""
    return items_per_iteration(Qb, item_query_bytes(q.shape[1], Qb, q.shape[2],
                                                    dtype_bytes(mm_dtype)))


def block_columns(st, chunks):
    """``st.block_t``: [R, chunks * T] token columns of a static block of ``chunks`` chunks
    (every block's the same: the iota made once)."""
    st.block_t = nl.ndarray((st.R, chunks * st.T), nl.int32, buffer=nl.sbuf, name="block_t")
    nisa.iota(dst=st.block_t, pattern=[[1, chunks * st.T]], offset=0, channel_multiplier=0)


def run_item_loops(st, span, span_cols):
    """A flat list of items: one loop per kind of item and width (U items an iteration, then
    U/2, ..., 1), trip counts from the core's span row; under LNC=2 then the split unit."""
    U = flat_items(st.q, st.Qb, st.mm_dtype)
    if static_block(st, True, TAIL_CHUNKS):      # the tails' mask columns
        block_columns(st, TAIL_CHUNKS)
    # the rows of the core's next loop iteration on partition 0, loaded while the one before it
    # runs (its first from START, then each iteration's NEXT): an iteration's first DMAs wait
    # for no table load of their own (v3+; NeuronCore-v2's first DMAs wait on its rows on every
    # partition all the same: verification 659 -> 661 us with them)
    ahead = None
    if st.indirect:
        ahead = nl.ndarray((1, U * META_COLS), nl.int32, buffer=nl.sbuf, name="next_items")
        load_rows_ahead(st, ahead, nisa.scalar_load(span[0:1, span_start(U):span_start(U) + 1]))
    for kind in range(len(ITEM_CLASSES)):
        count, masked = ITEM_CLASSES[kind]
        for width in loop_widths(U):
            col = span_column(kind, width, U)
            first = nisa.scalar_load(span[0:1, col:col + 1])
            end = nisa.scalar_load(span[0:1, col + 1:col + 2])
            nl.fori_loop(first, end, items_iteration(st, count, masked, width, chains_in(kind),
                                                     starts_fresh(kind), rows_ahead=ahead),
                         step=width)
    if st.cores == 2:          # the unit split between the cores: its part's state is in a slot
        slot = split_slot(st.q.shape[0] // st.Qb, st.p)     # a static slot (make_step's)
        b = nisa.scalar_load(span[0:1, span_cols - 1:span_cols])
        parts = []
        for t in range(len(st.tiles)):
            parts.append(load_state(st.scratch, slot, t, st.R, st.tiles[t][1] * st.GQ))
        merge_split(st, parts, b)


def load_rows_ahead(st, ahead, row):
    """Work-item rows row .. row + U - 1 into ``ahead`` [1, U * META_COLS]: what an
    iteration's first DMAs need of its rows (state slots, output rows, first page-list slots:
    partition 0), loaded while the iteration before it runs (the table has U rows past its
    last iteration's, work.table_rows)."""
    nisa.dma_copy(dst=ahead, src=st.meta.ap([[0, 1], [1, ahead.shape[1]]], scalar_offset=row,
                                            indirect_dim=0))


# Tail items (work.TAIL) of a loop iteration whose gathers are issued before any softmax
TAIL_AHEAD = 2
# K and V bytes per partition of a static pass's first gathers issued before any softmax: a
# Llama-3-8B step's 2 rows of 4 chunks; 16 rows of 4 chunks (256 KiB) overflowed SBUF. Their V
# zeroing delays the first softmax on ScalarE: 96 KiB -> 40 KiB, 24 x 32-256 keys 100.7 -> 96.1
# us (trn2; the others within 1%)
STATIC_UPFRONT_BYTES = 40 * 1024


def issue_gathers(st, item, count, masked, n):
    """Issue the item's first ``n`` gathers (``item.loads``, which the pipeline then uses)."""
    if n and item.loads is None:
        item.loads = {}
    load = loader(st, item, count, masked)
    for g in range(n):
        item.loads[f"{g}"] = k_first(st, load, g)


def upfront_gathers(st, count, masked, width):
    """Per item of a masked loop body, how many of its first gathers are issued before any
    softmax, in the order the pipeline consumes them (an item's gathers, then the next
    item's): a flat list's tails one each for TAIL_AHEAD items (every item when not tails); a
    static pass as many as STATIC_UPFRONT_BYTES holds, so a row's second softmax step does not
    wait behind the other rows' first gathers (4 x 100-800 keys: 72.6 -> 63.8 us)."""
    ahead = []
    if st.scratch is not None:
        first = TAIL_AHEAD if count > 1 else width
        for k in range(width):
            ahead.append(1 if k < first else 0)
        return ahead
    chunks, steps = fold_shape(st, count, masked)[1:]
    blocks = max(1, STATIC_UPFRONT_BYTES // (st.pack * chunks * st.geo.H * (st.T + st.D)
                                             * st.k_bytes))
    for k in range(width):
        ahead.append(max(0, min(steps, blocks - k * steps)))
    return ahead


def static_prep(st, batch, count):
    """For ``fold_items``: a function making the queries and masks of a static pass's rows up
    to k not made yet, which the pipeline calls a few rows ahead of their scores (made for
    every row before the first softmax, a 32-row pass's first exp waited ~20 us on them). The
    rows' queries are loaded here, before any gather (their DMAs queue behind none), and the
    first rows' made."""
    made, loaded = [], []
    for k in range(len(batch)):
        rows = []
        for t in range(len(st.tiles)):
            h0, n, q0 = st.tiles[t]
            rows.append(query_rows(st.q, batch[k].b, h0, n, st.G, st.Qt, q0))
        loaded.append(rows)
    # the rows take turns over a few zero-padded stationaries (as many as the most rows in
    # flight: a later section's rows reuse an earlier one's and add what they lack)
    if st.q_pads is None:
        st.q_pads = {}
    if st.q_pool or not st.q_pads:
        while st.q_pool < min(PREP_AHEAD + 2, len(batch)):
            for t in range(len(st.tiles)):
                n = st.tiles[t][1]      # a request's rows each (packed: st.pack requests)
                st.q_pads[f"{st.q_pool},{t}"] = query_pads(n, n // st.pack * st.GQ, st.D,
                                                           st.mm_dtype, nisa.engine.vector)
            st.q_pool = st.q_pool + 1
    pool = st.q_pool

    def prep(k):
        while len(made) <= min(k, len(batch) - 1):
            j = len(made)
            item_queries(st, batch[j], j % pool if pool else j, loaded[j])
            static_block_keep(st, batch[j], count)
            made.append(j)
    prep(min(PREP_AHEAD, len(batch) - 1))
    return prep


def items_iteration(st, count, masked, width, chained, fresh=False, last_kept=False,
                    rows_ahead=None):
    """The body of a loop over ``width`` items of one kind: every item's setup first, a masked
    kind's first gathers before any softmax (each one's addresses on VectorE never wait behind
    another's softmax), then all the items' chunks as one software pipeline (the next item's
    scores are made while this one's softmax runs); an item finishes inside the next one's
    chunks, after that one's first softmax step, so its DMAs sit behind gathers already
    issued. ``chained``: the items start from their units' states (``work.chains_in``);
    ``fresh``: those are the identity (``work.starts_fresh``), nothing to load;
    ``last_kept``: the last item is returned unfinished (its states complete); ``rows_ahead``:
    the [1, U * META_COLS] tile holding the iteration's rows on partition 0, loaded by the
    iteration before it (``load_rows_ahead``), which this one reloads with the next's (its
    first row's NEXT)."""
    def iteration(i):
        # every item's table row first, one DMA for the iteration: the DMAs that depend on one
        # (queries, page ids) then never queue behind another's
        pack = st.pack                 # requests an item (a static pass's packed tiles)
        table, rows = item_row(st, i, count, width // pack, tile=True)
        batch = []
        # a static pass's rows make their queries and masks in the pipeline (static_prep)
        lazy = masked and st.scratch is None and static_block(st, masked, count)
        for k in range(width // pack):
            head = None
            if rows_ahead is not None:
                head = rows_ahead[0:1, k * META_COLS:(k + 1) * META_COLS]
            batch.append(prepare(st, i + k * pack, count, masked, rows[k], k, chained, fresh,
                                 head, lazy))
        prep = None
        if batched_chunks(st, count, masked):
            first_chunks(st, table, batch)
        elif masked:
            # the items whose first gathers are issued here (the pipeline fetches the others'
            # two steps ahead), so SBUF holds a few blocks, not all: a flat list's tails
            # TAIL_AHEAD, a static pass's rows as many as STATIC_UPFRONT_BYTES holds
            # a static pass loads every row's cache rows first (the host made them), then
            # gathers; a flat list's tails each item's rows, then its gathers
            ahead = upfront_gathers(st, count, masked, len(batch))
            rows_first = st.scratch is None
            block = static_block(st, masked, count)
            if rows_first:
                if block:
                    static_rows(st, i, batch, count)
                    prep = static_prep(st, batch, count)
                for k in range(len(batch)):
                    issue_gathers(st, batch[k], count, masked, ahead[k])
            else:
                for k in range(width):
                    if block:
                        static_block_rows(st, batch[k], count)
                        static_block_keep(st, batch[k], count)
                    issue_gathers(st, batch[k], count, masked, ahead[k])
        if count:
            fold_items(st, batch, count, masked, prep=prep)    # finishes each item but the last
        else:
            for k in range(1, len(batch)):
                finish(st, batch[k - 1])
        if last_kept:
            return batch[-1]
        finish(st, batch[-1])
        if rows_ahead is not None:
            load_rows_ahead(st, rows_ahead, nisa.scalar_load(rows_ahead[0:1, NEXT:NEXT + 1]))
        return None
    return iteration


























