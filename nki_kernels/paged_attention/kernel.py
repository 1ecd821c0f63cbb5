"""Attention over a paged KV cache as an NKI kernel (online softmax over KV chunks): batch decode,
and blocks of query tokens per request (speculative verification, chunked prefill).

Dimensions:  B query rows (work items x Qb; a bucket: rows past the real ones are padding),
    HQ query heads, H kv heads, G = HQ / H, D head_dim (<= 512), T chunk tokens,
    Qb query tokens per work item (1 for decode)
Args (device):
    q: [B, HQ, D] @ HBM (fp32 / fp16 / bf16); a work item's queries are rows OUT..OUT+Qb
    k_rows, v_rows: the cache as rows of D elements [R, D] @ HBM (v_rows None for a fused cache:
        V rows sit ``v_rows_offset`` rows after K rows)
    meta: [rows, META_COLS] int32 work items (plan.py): a unit (request, or block of its
        queries) over one kind of chunk range (plan.ITEM_CLASSES: no keys, one masked chunk, or
        a mask-free block of 32, 16, ..., 1 chunks): kv_indices start, keys end and window start
        of the unit, the item's chunk bounds and where its first chunk starts, first query row,
        each query row's causal bound and window span, and the softmax-state slots it chains
        through (LOAD, STORE); spans: [cores, plan.span_cols(U)] int32, the rows each core runs
        per kind and loop width, and the split unit's slot and output row (LNC=2); whole units:
        [cores, plan.WHOLE_UNIT_SPAN_COLS], the core's units and its part of the split one
    kv_indices: [>= pages + T, 1] int32 (padded)
    tok_tab: [T, 2] int32 (page slot, entry of chunk-local token t)
    row_tab: [G*Qb, 1] int32, the query token (r // G) of a kv head's score row r, or None
        (Qb = 1); sinks: [HQ, 1] fp32 or None
    static: kv heads, page size, row strides, a token's K (or V) pattern (access_patterns
        PagedKVLayout.token), scale = sm_scale * k_scale, soft_cap, v_scale,
        matmul dtype: shapes and model constants only, so one compile serves every step of a
        shape bucket
Returns out [B, HQ, D] (q dtype) and lse [B, HQ, 1] fp32, base 2, @ shared HBM.

Control flow is on the device: one loop per kind of work item and width (U items per iteration,
then U/2, ..., 1 for the remainder), trip counts read from ``spans`` by ``nisa.scalar_load``; the
body of a kind is that kind's static program (a block of 32 chunks: 32 chunks of straight-line
code). No loop runs per request, so a step pays a loop barrier per U items, not per request and
kind of chunk, and the program size does not grow with batch or length. A unit's softmax state
(fp32 [rows, D + 2]: -max, sum, acc) chains from item to item through an HBM scratch: an item
folds its chunks into a fresh state, merges the state its unit's earlier items left in slot LOAD
(the identity for its first item), keeps the result in slot STORE and writes the unit's output
(rewritten by the unit's later items). With ``kernel[2]`` (LNC=2) each program instance runs the
items of its own units and of its part of the one unit split between the two (the host cuts the
step's chunks into equal halves, plan.decode_work); the two parts' states are exchanged with
``nisa.sendrecv`` and merged, and program 0 writes that unit.
Blocks of several queries (verification, chunked prefill) run as whole units instead
(plan.whole_units): one loop over the core's units, each folding all its chunks in loops nested
in it (masked chunks one at a time, mask-free ones in blocks of 32, 16, ..., 1), its state in
SBUF from first chunk to output: a prefill block's state (2 MB at 8 kv heads, D 128) chained
through HBM per kind of chunk range would move more bytes than its keys.
Tiling per work item: tiles of score rows, each a group of kv heads and Qt = min(Qb, 128 // G)
of the item's query tokens (rows R = heads x G x Qt <= 128 on partitions, kv head j's rows
ordered (query token, g); each row masked to its own keys; the tiles of one step share the
chunk's K^T per kv head and its V): scores[R, T]
accumulate one matmul per head in PSUM fp32 (stationary = that head's qT zero-padded to R columns,
moving = K^T made on TensorE, D > 128 in 128-row K-tiles), one online softmax for the whole group
(VectorE max, ScalarE exp with fused row sum, running rescale), and P @ V per head as
(V_j stationary, head j's columns of P^T moving) into head j's columns of a [D, R] PSUM tile,
transposed back once per step. Each item is software-pipelined in program order (gathers
two steps ahead, scores up to 8 tiles ahead, the cache rows of a whole block of chunks made up
front), so every engine has the next step's work queued while the current one finishes.
"""

from __future__ import annotations

from nki_kernels.backend import nki, nisa, nl
from nki_kernels.kernel_dtypes import dtype_bytes
from nki_kernels.launch_options import program_cores
from nki_kernels.paged_kv_append.kernel import scatter_rows

from .kernel_cursor import (Geometry, advance, block_bounds, item_columns, query_of_row,
                            request_bounds, start_cursor, token_validity)
from .kernel_load import (ROW_LIMIT, KVTile, block_page_ids, block_rows, converted_v,
                          group_entry_rows, group_size, load_chunk_indirect, load_chunk_pages,
                          load_group_indirect, load_group_pages, step_chunks)
from .kernel_queries import group_queries
from .kernel_softmax import (chunk_scores, finalize, k_transposed, load_state, mask_keep,
                             merge_states, merge_with_partner, poison_state, softmax_step,
                             state_tile, state_views, store_state)
from .work import (C0, C1, CHUNK_BLOCKS, FULL_HI, FULL_LO, ITEM_CLASSES, LOAD, OUT, STORE,
                   items_per_iteration, loop_widths, span_column, state_slots, whole_units)


# Chunks per softmax step: a mask-free block gathered several tokens per partition folds them
# in steps of up to 4 chunks (kernel_load.step_chunks: 4 x 128 keys of fp32 scores fill one 2 KiB
# PSUM bank, so the fixed cost of every softmax instruction is paid once per 512 keys), one or
# more steps per gather (kernel_load.group_size: 8 KiB of K per partition for NHD, 32 KiB for
# HND); chunks gathered one at a time (masked chunks, NeuronCore-v2, pages over 128) fold
# FOLD_WIDTH per step only when blocks of queries fill several tiles per chunk (prefill), else one.
FOLD_WIDTH = 4
# Tiles of query rows whose scores are made ahead of the softmax (a step ahead when a step has
# no more tiles than this; each is an [R, <= 512] fp32 tile in SBUF).
SCORES_AHEAD = 8
# Mask-free chunks of a work item come in blocks of plan.CHUNK_BLOCKS: a block of 32 chunks (4096
# tokens) is one item, so a loop iteration of U items carries enough work to hide its barrier
# (~9 us, nki_kernels/profile) and pipeline fill (benchmarks/loop_blocks.py has the sweep).


@nki.jit
def batch_decode_kernel(q, k_rows, v_rows, meta, spans, kv_indices, tok_tab, row_tab, sinks,
                        num_kv_heads, page_size, strides, token_pattern, scale, soft_cap, v_scale,
                        mm_dtype):
    return attention(q, k_rows, v_rows, meta, spans, kv_indices, tok_tab, row_tab, sinks,
                     num_kv_heads, page_size, strides, token_pattern, scale, soft_cap, v_scale,
                     mm_dtype)


@nki.jit
def append_attention_kernel(q, k_rows, v_rows, key, value, slots, counts, quant, write, meta, spans,
                            kv_indices, tok_tab, row_tab, sinks, num_kv_heads, page_size, strides,
                            token_pattern, scale, soft_cap, v_scale, mm_dtype):
    """Fused write: the step's new K/V rows are scattered into the cache first, then attention
    reads them with the rest, in one launch. ``key``, ``value``, ``slots``, ``counts``, ``quant``
    and ``write`` = (token pattern, V offset, cache row elements, quantization limit) are
    paged_kv_append.kernel's arguments over the same cache, viewed there as rows of a page
    entry's elements (wider rows are quantized on write when ``quant`` is given); ``write``'s
    last item: the packed K+V write's parts (0: one write per K and V). Under LNC=2
    one core writes K and the other V, and both meet at a core barrier on each written tensor
    before reading."""
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
                     num_kv_heads, page_size, strides, token_pattern, scale, soft_cap, v_scale,
                     mm_dtype)


def attention(q, k_rows, v_rows, meta, spans, kv_indices, tok_tab, row_tab, sinks, num_kv_heads,
              page_size, strides, token_pattern, scale, soft_cap, v_scale, mm_dtype):
    """The kernel's body (arguments as above): returns out, lse."""
    B, HQ, D = q.shape
    H, G = num_kv_heads, HQ // num_kv_heads
    Qb = 1 if row_tab is None else row_tab.shape[0] // G      # query tokens per work item
    Qt = min(Qb, 128 // G)                                     # query tokens per tile
    assert Qb % Qt == 0, f"{Qb} query tokens per item is not a whole number of tiles of {Qt}"
    T = tok_tab.shape[0]
    rpp, es, v_rows_offset = strides
    geo = Geometry(T, page_size, rpp, es, D, H, token_pattern)
    sources = ((k_rows, 0), (k_rows, v_rows_offset * D) if v_rows is None else (v_rows, 0))
    out = nl.ndarray((B, HQ, D), q.dtype, buffer=nl.shared_hbm, name="out")
    lse = nl.ndarray((B, HQ, 1), nl.float32, buffer=nl.shared_hbm, name="lse")
    indirect = nisa.get_nc_version() >= 3 and k_rows.shape[0] < ROW_LIMIT
    tok_sb = nl.ndarray((T, 2), nl.int32, buffer=nl.sbuf, name="tok_tab")
    nisa.dma_copy(dst=tok_sb, src=tok_tab)
    GQ = G * Qt                                            # score rows per kv head and tile
    per_group = max(1, min(H, 128 // GQ))          # kv heads per tile: rows = heads x G x Qt <= 128
    # tiles of score rows (first kv head, kv heads, first query token of the block): every tile
    # of a chunk's step shares its K^T per kv head and its V
    tiles = []
    for h0 in range(0, H, per_group):
        for q0 in range(0, Qb, Qt):
            tiles.append((h0, min(per_group, H - h0), q0))
    R = per_group * GQ
    row_q = []                     # per tile of query tokens (q0 = j * Qt): its rows' tokens
    if Qb > 1:
        for q0 in range(0, Qb, Qt):
            row_q.append(query_of_row(row_tab, R, GQ, q0 * G))
    iota_rt = nl.ndarray((R, T), nl.int32, buffer=nl.sbuf, name="iota_rt")
    nisa.iota(dst=iota_rt, pattern=[[1, T]], offset=0, channel_multiplier=0)
    # OCP fp8 (e4m3fn) is a matmul input from NeuronCore-v4 only: V is converted per chunk before.
    convert_v = k_rows.dtype == nl.float8_e4m3fn and nisa.get_nc_version() < nisa.nc_version.gen4
    v_dtype = mm_dtype if convert_v else None
    consts = (geo, sources, iota_rt, indirect, v_dtype)
    # mask-free blocks of whole pages gather several consecutive tokens per partition
    blocked = page_size <= 128
    k_bytes = dtype_bytes(k_rows.dtype)

    def gathered(count):
        """Tokens per partition of a gather of a mask-free block of ``count`` chunks."""
        return group_size(geo, count, k_bytes) if blocked else 1

    entry_rows = {}                # by f"{group}" (NKI dict keys are strings), groups ascending
    if blocked and indirect:
        groups = []
        for size in CHUNK_BLOCKS:
            groups.append(gathered(size))
        for g in range(1, max(groups) + 1):
            if g in groups:
                entry_rows[f"{g}"] = group_entry_rows(tok_tab, geo, g)

    U = items_per_iteration(Qb)
    whole = whole_units(Qb)
    if not whole:
        units = B // Qb
        scratch = nl.ndarray((state_slots(units), len(tiles) * R, D + 2), nl.float32,
                             buffer=nl.private_hbm, name="states")
        identity = state_slots(units) - 1
        start = state_tile(R, D)
        for t in range(len(tiles)):
            nisa.dma_copy(dst=scratch[identity, t * R:(t + 1) * R, :], src=start)

    def cache_rows(item, count, masked):
        """Set the item's "rows" and "pids" for the ``count`` chunks at its cursor: a mask-free
        block's cache rows (indirect gathers) or page ids (one DMA per page), made up front;
        None otherwise."""
        group = 1 if masked else gathered(count)
        item["rows"], item["pids"] = None, None
        if blocked and not masked and indirect:
            item["rows"] = block_rows(kv_indices, item["cursor"], count, geo, group,
                                      entry_rows[f"{group}"])
        elif blocked and not masked and group > 1:
            item["pids"] = block_page_ids(kv_indices, item["cursor"], count, geo)

    def prepare(i, count, masked):
        """Work item i's setup, issued for all items of a loop iteration before any of their
        chunks: its table row, queries, bounds, cursor and a mask-free block's cache rows, so
        the next item's first gather never waits behind this one's chunks (the state slots it
        chains through: flat list only)."""
        cols = item_columns(meta, i, max(T, R) if count else 1)
        states = []
        for tile in tiles:
            states.append(state_tile(tile[1] * GQ, D))
        item = {"cols": cols, "b": nisa.scalar_load(cols[0:1, OUT:OUT + 1]), "states": states}
        if not whole:
            item["load"] = nisa.scalar_load(cols[0:1, LOAD:LOAD + 1])
            item["store"] = nisa.scalar_load(cols[0:1, STORE:STORE + 1])
        if count == 0:
            return item
        queries = []
        for t in range(len(tiles)):
            h0, n, q0 = tiles[t]
            pads, poison = group_queries(q, item["b"], h0, n, G, Qt, mm_dtype, q0)
            queries.append(pads)
            if poison is not None:
                poison_state(states[t], poison)
        item["q"] = queries
        # per tile of query tokens: the item's bounds (the token-level ones are common)
        item["bounds"] = [request_bounds(cols, T, R)] if Qb == 1 else block_bounds(cols, T, row_q)
        item["cursor"] = start_cursor(cols, tok_sb, R)
        cache_rows(item, count, masked)
        return item

    def shape(count, masked):
        """(tokens per partition of a gather, chunks per softmax step, softmax steps) of an
        item of ``count`` chunks."""
        group = 1 if masked else gathered(count)
        width = (step_chunks(geo, group) if group > 1 else
                 min(count, FOLD_WIDTH if len(tiles) > 1 and Qb > 1 else 1))
        return group, width, count // width

    def loader(item, count, masked):
        """load(g): the (K, V) views and mask predicate of the item's gather g."""
        group, width, _ = shape(count, masked)
        rows, pids, cursor, bounds = item["rows"], item["pids"], item["cursor"], item["bounds"]

        def load(g):
            chunks = []
            if group > 1:
                if indirect:
                    pairs = load_group_indirect(sources, rows[:, g:g + 1], geo, group, v_dtype)
                else:
                    pairs = load_group_pages(sources, pids, g * T * group // page_size, geo,
                                             group, v_dtype)
                for views in pairs:
                    chunks.append((views, None))
                return chunks
            for k in range(g * width, (g + 1) * width):
                chunks.append(_load_chunk(consts, kv_indices, cursor, bounds, masked,
                                          None if rows is None else rows[:, k:k + 1]))
            return chunks
        return load

    def blocks(item, count, masked):
        """A nested loop's body (whole units): the next ``count`` chunks of the item at its
        cursor, folded into its states (a mask-free block's cache rows made per iteration)."""
        def body(_):
            this = {}
            for key in item.keys():
                this[key] = item[key]
            cache_rows(this, count, masked)
            fold(this, count, masked)
        return body

    def fold(item, count, masked, finish_first=None):
        """The item's ``count`` chunks, ``width`` per softmax step (one [rows, width*T] score
        tile), software-pipelined in program order: gathers run two steps ahead and scores up
        to SCORES_AHEAD tiles ahead of the softmax (a whole step when it has no more tiles), so
        TensorE makes the next scores while VectorE and ScalarE finish these, and the DMAs
        overlap both. A mask-free block's gathers take ``group`` tokens per partition, folded
        ``width`` chunks per softmax step (``per_load`` steps per gather). ``finish_first``: an
        item to ``finish`` after the first softmax step; ``item["loads"]``: gathers issued
        before (by f"{gather}": NKI dict keys are strings)."""
        group, width, steps = shape(count, masked)
        per_load = max(1, group // width)          # softmax steps per load
        states = []
        for t in item["states"]:
            states.append(state_views(t))
        load = loader(item, count, masked)

        loads = item["loads"] if "loads" in item else {}
        kts = {}                                   # K^T by f"{step},{first kv head}"

        def step(s):
            """The chunks of softmax step s, loading them on first use."""
            key = f"{s // per_load}"
            if key not in loads:
                loads[key] = load(s // per_load)
            k = (s % per_load) * width
            return loads[key][k:k + width]

        def score(u):
            """Scores of unit u = (step, tile); K^T of a step's chunks made once per kv heads,
            at their first tile, dropped after their last."""
            s, t = u // len(tiles), u % len(tiles)
            h0, n, q0 = tiles[t]
            loaded = step(s)
            key = f"{s},{h0}"
            if key not in kts:
                kts[key] = []
                for chunk in loaded:
                    kts[key].append(k_transposed(chunk[0][0], h0, n, D, mm_dtype))
            keep = loaded[0][1]               # masked chunks are folded one at a time
            tile_rows = item["q"][t][0][0].shape[1]
            scores = chunk_scores(item["q"][t], kts[key], T,
                                  None if keep is None else keep[q0 // Qt][0:tile_rows, :],
                                  scale, soft_cap, mm_dtype)
            if t + 1 == len(tiles) or tiles[t + 1][0] != h0:
                kts.pop(key)                  # its tiles are free from here on
            return scores

        units_, ahead = steps * len(tiles), min(len(tiles), SCORES_AHEAD)
        for s in range(min(2, steps)):
            step(s)
        pending = []
        for u in range(min(ahead, units_)):
            pending.append(score(u))
        for u in range(units_):
            s, t = u // len(tiles), u % len(tiles)
            if t == 0 and s + 2 < steps:
                step(s + 2)
            if u + ahead < units_:
                pending.append(score(u + ahead))
            softmax_step(states[t], pending.pop(0), tiles[t][1], _v_views(step(s)), tiles[t][0],
                         D, mm_dtype)
            if t + 1 == len(tiles) and s % per_load == per_load - 1:
                loads.pop(f"{s // per_load}")    # its tiles are free from here on
            if u + 1 == len(tiles) and finish_first is not None:
                finish(finish_first)             # the previous item (see iteration)

    def finish(item):
        """Chain the item's state onto its unit's (scratch slot LOAD: the unit's earlier items,
        or the identity), keep it in slot STORE and write the unit's output and LSE (a later
        item of the unit writes them again)."""
        for t in range(len(tiles)):
            n, tile = tiles[t][1], item["states"][t]
            kept = load_state(scratch, item["load"], t, R, n * GQ)
            merge_states(state_views(tile), state_views(kept))
            store_state(scratch, item["store"], t, R, tile)
        write(item["states"], item["b"])

    def write(states, b):
        """Output rows and LSE of unit output row ``b`` from its states (one per tile)."""
        for t in range(len(tiles)):
            h0, n, q0 = tiles[t]
            tile = states[t]
            finalize(state_views(tile), out, lse, sinks, b, h0, G, Qt, v_scale, q0)

    def merge_split(states, b):
        """LNC=2: this core's part of the unit split between the cores merged with the other's
        (both end with the merged states); program 0 writes the unit."""
        for tile in states:
            merge_with_partner(tile, p)
        if p == 0:
            write(states, b)

    def unit(i):
        """Whole unit i: its chunks in loops nested in the item, masked ones alone and the
        mask-free ones in CHUNK_BLOCKS (as many of each size as fit, largest first); returns
        the item, its states complete."""
        item = prepare(i, 1, True)
        cols = item["cols"]
        c0 = nisa.scalar_load(cols[0:1, C0:C0 + 1])
        full_lo = nisa.scalar_load(cols[0:1, FULL_LO:FULL_LO + 1])
        full_hi = nisa.scalar_load(cols[0:1, FULL_HI:FULL_HI + 1])
        c1 = nisa.scalar_load(cols[0:1, C1:C1 + 1])
        nl.fori_loop(c0, full_lo, blocks(item, 1, True))
        lo = full_lo
        for size in CHUNK_BLOCKS:
            hi = lo + ((full_hi - lo) // size) * size if size > 1 else full_hi
            nl.fori_loop(lo, hi, blocks(item, size, False), step=size)
            lo = hi
        nl.fori_loop(full_hi, c1, blocks(item, 1, True))
        return item

    p, cores = nl.program_id(0), program_cores()
    span = nl.ndarray((1, spans.shape[1]), nl.int32, buffer=nl.sbuf, name="span")
    nisa.dma_copy(dst=span, src=spans[p:p + 1, :])
    if whole:
        def whole_unit(i):
            item = unit(i)
            write(item["states"], item["b"])
        first, end = nisa.scalar_load(span[0:1, 0:1]), nisa.scalar_load(span[0:1, 1:2])
        nl.fori_loop(first, end, whole_unit)
        if cores == 2:
            item = unit(nisa.scalar_load(span[0:1, 2:3]))
            merge_split(item["states"], item["b"])
        return out, lse
    for kind in range(len(ITEM_CLASSES)):
        count, masked = ITEM_CLASSES[kind]
        for width in loop_widths(U):
            col = span_column(kind, width, U)
            first = nisa.scalar_load(span[0:1, col:col + 1])
            end = nisa.scalar_load(span[0:1, col + 1:col + 2])

            def iteration(i, count=count, masked=masked, width=width):
                batch = []
                for k in range(width):
                    batch.append(prepare(i + k, count, masked))
                if masked:      # every item's gather before any softmax: each one's addresses
                    for item in batch:   # (VectorE) never wait behind another's softmax
                        item["loads"] = {"0": loader(item, count, masked)(0)}
                # an item finishes inside the next one's chunks, after that one's first softmax
                # step: its DMAs then sit behind gathers already issued, not in front of them
                for k in range(len(batch)):
                    before = batch[k - 1] if k else None
                    if count:
                        fold(batch[k], count, masked, before)
                    elif before is not None:
                        finish(before)
                finish(batch[-1])
            nl.fori_loop(first, end, iteration, step=width)
    if cores == 2:          # the unit split between the cores: its part's state is in a slot
        cols = spans.shape[1]
        slot = nisa.scalar_load(span[0:1, cols - 2:cols - 1])
        b = nisa.scalar_load(span[0:1, cols - 1:cols])
        parts = []
        for t in range(len(tiles)):
            parts.append(load_state(scratch, slot, t, R, tiles[t][1] * GQ))
        merge_split(parts, b)
    return out, lse


def _v_views(chunks):
    """The V views of loaded chunks ((K, V), keep), as a list (a temporary: the simulator frees
    a tile when its last reference goes, as the compiler frees it after its last use)."""
    views = []
    for chunk in chunks:
        views.append(chunk[0][1])
    return views


def _load_chunk(consts, kv_indices, cursor, bounds, masked, rows=None):
    """Gather the cursor's chunk ((K, V) KVTile pair of tiles [T, H*D], the mask predicates when
    masked), then advance the cursor; ``rows``: the chunk's cache rows from ``block_rows``
    (which advanced the cursor already)."""
    geo, sources, iota_rt, indirect, v_dtype = consts
    T, H, D = geo.T, geo.H, geo.D
    tokens = bounds[0]                        # token-level bounds: the same for every tile
    valid_t = token_validity(cursor, tokens) if masked else None
    dtype = sources[0][0].dtype
    if not indirect and sources[0][0] is sources[1][0]:      # fused cache: one DMA per page
        kv = nl.ndarray((T, 2 * H * D), dtype, buffer=nl.sbuf, name="kv_sb")
        load_chunk_pages([kv], sources, kv_indices, cursor, tokens, valid_t, geo)
        views = [KVTile(kv, 0, D), KVTile(kv, H * D, D)]
    else:
        kv_tiles = [nl.ndarray((T, H * D), dtype, buffer=nl.sbuf, name="k_sb"),
                    nl.ndarray((T, H * D), dtype, buffer=nl.sbuf, name="v_sb")]
        if indirect:
            load_chunk_indirect(kv_tiles, sources, kv_indices, cursor, valid_t, geo, rows)
        else:
            load_chunk_pages(kv_tiles, sources, kv_indices, cursor, tokens, valid_t, geo)
        views = [KVTile(kv_tiles[0], 0, D), KVTile(kv_tiles[1], 0, D)]
    keep = None
    if masked:                     # per tile of query tokens, as ``bounds``
        keep = []
        for b in bounds:
            keep.append(mask_keep(cursor, b, iota_rt))
    if rows is None:
        advance(cursor, geo.page_size)
    if v_dtype is not None:        # fp8 V as a matmul input before NeuronCore-v4: converted
        views[1] = converted_v(views[1:], v_dtype)[0]
    return (views[0], views[1]), keep
