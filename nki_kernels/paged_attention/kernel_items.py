"""The work items of the attention kernel (``kernel.py``), as named steps over the launch's
``Step``: an item's setup (``prepare``), its chunks folded into its softmax states (``fold``,
software-pipelined; ``blocks`` for the nested loops of a whole unit), its state chained through
the HBM scratch and its output written (``finish``, ``write``), the LNC=2 merge
(``merge_split``) and a whole unit (``unit``)."""

from __future__ import annotations

from nki_kernels.backend import nisa, nl

from .kernel_cursor import (advance, block_bounds, drop_invalid, item_columns, query_row_keys,
                            request_bounds, start_cursor, token_validity)
from .kernel_load import (PSUM_BANK_BYTES, KTTile, KVTile, PackedKT, PackedKV, block_page_ids,
                          block_pages, block_rows, converted_v, group_size, load_chunk_indirect,
                          load_chunk_pages, load_group_indirect, load_group_pages, piece,
                          rows_of_pages, step_chunks, transpose_rows)
from .kernel_mask import mask_start, masked_keep
from .kernel_queries import group_queries, head_queries, query_block_rows, query_tile_rows
from .kernel_softmax import (KeyRange, bank_column, blank_bank, blank_state, chunk_scores,
                             evict_scores, finalize, finalize_bank, forget_unseen, group_stats,
                             group_sums, head_major, k_transposed, keys_between, load_bank,
                             load_state, mask_keep, merge_bank_with_partner, merge_states,
                             merge_with_partner, poison_state, raw_scores, side_by_side,
                             softmax_begin, softmax_end, state_bank, state_tile, state_views,
                             store_bank, store_state)
from .work import (C0, C1, CHUNK_BLOCKS, ENTRY0, FULL_HI, FULL_LO, LEN, LOAD, META_COLS, OUT,
                   POS0, ROUND_CHUNKS, ROUND_SLOT, ROUNDS, ROUNDS1, SLOT0, STORE, TAIL_CHUNKS,
                   STATIC_MAX_CHUNKS, WIN, static_core_rows, static_split)


# Chunks per softmax step: a mask-free block gathered several tokens per partition folds them
# in steps of up to 4 chunks (kernel_load.step_chunks: 4 x 128 keys of fp32 scores fill one 2 KiB
# PSUM bank, so the fixed cost of every softmax instruction is paid once per 512 keys), one or
# more steps per gather (kernel_load.group_size: 8 KiB of K per partition for NHD, 32 KiB for
# HND); chunks gathered one at a time (masked chunks, NeuronCore-v2, pages over 128) fold
# FOLD_WIDTH per step only when blocks of queries fill several tiles per chunk (prefill), else one.
FOLD_WIDTH = 4


# K and V bytes per partition of the one-chunk masked items' gathers a loop iteration issues
# before any softmax (``first_chunks``): all 16 of a Llama-3-8B decode (4 KiB each); an fp32
# cache of 4 kv heads x 256 loads 8 up front (16 overflowed SBUF beside verification's tiles)
UPFRONT_BYTES = 64 * 1024


# Largest V tile (bytes per partition) a softmax step's end may hold one unit past its begin
LAG_TILE_BYTES = 16 * 1024


# Units a softmax step's end lags its begin when P^T comes by DMA transpose (the transpose's
# ~1 us latency then hides behind the next units' exponentials; cost model, trn2, prefill 1k:
# lag 1 1188 us, 2 1143, 4 1095, 8 1075 with P^T held 4x as long), DMA_PT_LAG_FEW when a step
# has at most DMA_PT_FEW_TILES tiles (units of up to 128 queries of a Llama-3-8B layer), whose
# next group's statistics otherwise queue behind the ends of tiles still waiting on their P^T:
# the chunked LNC=2 replays' launches 262.1 -> 254.1 us a step (chunks of 64), 297.6 -> 294.4
# (128); shared prefix 197.0 -> 193.0, verification 8 x 8 drafts 308.0 -> 307.1. Steps of 64
# tiles lose with 8 (chunked 256 over 1k 188.9 -> 198.3 us; a lag counted in chunks 191.6).
DMA_PT_LAG = 4
DMA_PT_LAG_FEW = 8
DMA_PT_FEW_TILES = 32


# Tiles of query rows whose scores are made ahead of the softmax (a step ahead when a step has
# no more tiles than this; each is an [R, <= 512] fp32 tile in SBUF).
SCORES_AHEAD = 8
# Items of a static pass whose queries and mask are made ahead of the one whose scores are next
PREP_AHEAD = 2
# K and V bytes per partition of a packed static step's gathers (its requests' chunks; three
# steps are in flight): Llama-3-8B bf16 two chunks a step at four requests (trn2: 12 x 500-620
# keys 111.1 -> 106.1 us, 16 x 600-1500 229.4 -> 220.5; 8 x 1024 101.2 -> 104.1)
PACKED_STEP_BYTES = 32 * 1024


class WorkItem(nl.NKIObject):
    """One work item in flight: its table row ``cols`` and output row ``b``, its softmax
    ``states`` (one tile per tile of score rows), the state slots it chains through (``load``,
    ``store``: flat list only), its queries ``q`` (per tile), ``bounds`` and ``cursor``, a
    mask-free block's cache ``rows`` or page ids ``pids``, and gathers issued ahead
    (``loads``, by f"{gather}": NKI dict keys are strings); ``bank``: the ``state_bank`` its
    states are views of (whole units with grouped softmax statistics), else None; ``chained``:
    its states started as its unit's (``prepare``), so ``finish`` merges nothing in; ``keep``:
    a static block's mask predicate of all its chunks per tile of query tokens (a list:
    ``block_of_masked_chunks``, ``unit_tail_block``), else None; ``head``: its table row on
    partition 0 (``prepare``)."""

    def copy(self):
        """A shallow copy (a nested loop's body sets its own rows / pids on it)."""
        return WorkItem(cols=self.cols, b=self.b, states=self.states, load=self.load,
                        store=self.store, q=self.q, bounds=self.bounds, cursor=self.cursor,
                        rows=self.rows, pids=self.pids, loads=self.loads, bank=self.bank,
                        chained=self.chained, keep=self.keep, head=self.head)


def gathered(st, count):
    """Tokens per partition of a gather of a mask-free block of ``count`` chunks."""
    return group_size(st.geo, count, st.k_bytes) if st.blocked else 1


def set_cache_rows(st, item, count, masked):
    """Set the item's ``rows`` and ``pids`` for the ``count`` chunks at its cursor: a mask-free
    block's cache rows (indirect gathers) or page ids (one DMA per page), made up front; None
    otherwise. A static block only has its page-id DMA issued here (``pids``): its rows and
    mask come after every item of the iteration has issued its own (``static_block_rows``)."""
    group = 1 if masked else gathered(st, count)
    item.rows, item.pids = None, None
    if static_block(st, masked, count):       # a static pass's rows come from the host
        item.pids = None if in_static_pass(st) else block_pages(st.kv_indices, item.cursor,
                                                                count, st.geo, 1)
    elif st.blocked and not masked and st.indirect:
        item.rows = block_rows(st.kv_indices, item.cursor, count, st.geo, group,
                               st.entry_rows[f"{group}"], moves=st.whole)
    elif st.blocked and not masked and group > 1:
        item.pids = block_page_ids(st.kv_indices, item.cursor, count, st.geo)


def prepare(st, i, count, masked, cols=None, slot=0, chained=False, fresh=False, head=None,
            lazy=False):
    """Work item i's setup, issued for all items of a loop iteration before any of their
    chunks: its table row (``cols``, when the caller loaded it: ``item_row``), queries, bounds,
    cursor and a mask-free block's cache rows, so the next item's first gather never waits
    behind this one's chunks (the state slots it chains through: flat list only). ``slot``:
    the item's place in its loop iteration (its kept query pads, ``Step.q_pads``);
    ``chained``: its states start as its unit's (scratch slot LOAD), loaded here, unless
    ``fresh``: the unit's state is still the identity (``work.starts_fresh``): the item starts
    a state of its own, as an unchained item, and has nothing to merge at its end (no LOAD).
    ``head``: its row on one partition, loaded ahead (``kernel.load_rows_ahead``): its scalars
    and first page-list slot are read there, so its first DMAs do not wait for ``cols``.
    ``lazy``: its queries are left to ``item_queries`` (a static pass's rows, made in the
    pipeline a few rows ahead of their scores)."""
    if cols is None:
        cols = item_row(st, i, count)
    if head is None:
        head = cols[0:1, :]
    if fresh:
        chained = False
    load, store = None, None
    if st.scratch is not None:
        load = None if fresh else nisa.scalar_load(head[0:1, LOAD:LOAD + 1])
        store = nisa.scalar_load(head[0:1, STORE:STORE + 1])
    b = static_out_row(st, i)
    if b is None:
        b = nisa.scalar_load(head[0:1, OUT:OUT + 1])
    item = WorkItem(cols=cols, b=b, states=None,
                    load=load, store=store, q=None, bounds=None, cursor=None, rows=None,
                    pids=None, loads=None, bank=None, chained=chained, keep=None, head=head)
    # a flat-list item's page ids first: the iteration's first gathers queue behind no state
    # or query load (a static pass's after its queries: 4 x 100-800 73.7 -> 74.3 us otherwise)
    early = count and (lean_item(st, masked)
                       or (static_block(st, masked, count) and st.scratch is not None))
    if early:
        _lean_rows(st, item, head, count, masked)
    bank = None
    if st.group > 1 and tail_first(st):
        bank, states = blank_bank(st.R, st.D, len(st.tiles))
    elif st.group > 1:
        bank, states = state_bank(st.R, st.D, len(st.tiles))
    elif banked(st):               # the tiles' states in one bank: one DMA each way
        if chained:
            bank, states = load_bank(st.scratch, load, st.R, len(st.tiles))
        elif count and st.first_init:
            bank, states = blank_bank(st.R, st.D, len(st.tiles))
        else:
            bank, states = state_bank(st.R, st.D, len(st.tiles))
    else:
        states = []
        for t in range(len(st.tiles)):  # set by the first softmax step when the item has one
            rows = st.tiles[t][1] * st.GQ
            if chained:
                states.append(load_state(st.scratch, load, t, st.R, rows))
            elif count and (st.first_init or tail_first(st)):
                states.append(blank_state(rows, st.D))
            else:
                states.append(state_tile(rows, st.D))
    item.states, item.bank = states, bank
    if count == 0:
        return item
    if not lazy:
        item_queries(st, item, slot)
    if early:
        return item
    if static_block(st, masked, count):
        _lean_rows(st, item, head, count, masked)
        return item
    if batched_chunks(st, count, masked):     # loaded with its iteration's (first_chunks)
        item.bounds, item.cursor = [None], None
    else:
        # per tile of query tokens: the item's bounds (the token-level ones are common)
        item.bounds = ([request_bounds(cols, st.T, st.R, st.windowed)] if st.Qb == 1
                       else block_bounds(cols, st.T, st.row_q, st.windowed))
        item.cursor = start_cursor(cols, st.tok_sb, st.R, st.mask, st.iota_t)
    set_cache_rows(st, item, count, masked)
    return item


def item_queries(st, item, slot=0, tile_rows=None):
    """Set the item's ``q``: per tile its queries as the score matmuls' stationaries
    (``group_queries``; ``slot``: the item's place in its loop iteration, as ``prepare``;
    ``tile_rows``: each tile's query rows loaded before, ``query_rows``)."""
    queries, loaded = [], {}
    heads = head_major(st.tiles) if st.whole else 0
    together = None
    if item.bank is not None and not st.whole:     # side-by-side tiles: their rows in one DMA
        together = query_tile_rows(st.q, item.b, st.tiles[0][1], st.G, st.Qt, len(st.tiles))
    # whole units' one-kv-head tiles: their transposes evicted together (``head_queries``)
    batched = (heads and tile_rows is None and st.D <= 128 and st.pack == 1
               and nisa.get_nc_version() >= nisa.nc_version.gen3)
    batch_rows = []
    for t in range(len(st.tiles)):
        h0, n, q0 = st.tiles[t]
        rows = None
        if heads:                  # one DMA per query block for all kv heads
            if f"{q0}" not in loaded:
                loaded[f"{q0}"] = query_block_rows(st.q, item.b, heads, st.G, st.Qt, q0)
            rows = loaded[f"{q0}"][:, h0 * st.D:(h0 + 1) * st.D]
        elif together is not None:
            rows = together[:, t * st.D:(t + 1) * st.D]
        if tile_rows is not None:
            rows = tile_rows[t]
        if batched:
            batch_rows.append(rows)
            continue
        kept = st.q_pads.get(f"{slot},{t}") if st.q_pads is not None else None
        pads, poison = group_queries(st.q, item.b, h0, n, st.G, st.Qt, st.mm_dtype, q0, kept,
                                     rows, st.pack)
        queries.append(pads)
        if poison is not None:
            poison_state(item.states[t], poison)
    item.q = head_queries(batch_rows, st.mm_dtype) if batched else queries


def static_out_row(st, i):
    """A static pass's first output row of its table row ``i`` (an int there), as
    ``work.static_work`` lays them out: row b writes rows from b * Qb, a split bucket's two rows
    both from row 0. Its queries and output then move by static DMAs (no descriptors made at
    run time). None elsewhere."""
    if not isinstance(i, int) or st.scratch is not None or st.whole:
        return None
    return 0 if static_split(st.q.shape[0] // st.Qb, st.cores) else i * st.Qb


def _lean_rows(st, item, head, count, masked):
    """A lean item's or static block's cache rows (or page ids): its one block's rows (and a
    static block's mask) come from SLOT0 alone, no cursor or bounds."""
    item.bounds = [None]
    item.cursor = {"slot": head[0:1, SLOT0:SLOT0 + 1]}
    set_cache_rows(st, item, count, masked)


def lean_item(st, masked):
    """Whether a flat-list item's chunks need neither a cursor nor bounds: a mask-free block
    gathered by indirect DMA reads its cache rows (``block_rows``) from its first page-list slot
    and nothing after (the cursor's positions, entries and the bounds serve masks and later
    chunks only)."""
    return not st.whole and not masked and st.blocked and st.indirect


def tail_first(st):
    """Whether a whole unit's states start blank, set by its tail's softmax step (the unit's
    first: ``unit_group_begin`` folds the tails before any loop), so they need no identity
    memsets and the step no rescale (the values are those the identity would give)."""
    return st.whole and st.unit_tail > 0


def banked(st):
    """Whether a flat-list item keeps its tiles' states side by side in one bank, so they move
    to and from the scratch, and its queries and outputs, in one DMA for all tiles
    (``kernel_softmax.side_by_side`` tiles: verification of 8 drafts at GQA 4, 2 tiles)."""
    return st.scratch is not None and side_by_side(st.tiles)


def item_row(st, i, count, items=1, tile=False):
    """Work item i's table row on the partitions its setup reads (one DMA); ``items`` > 1: the
    rows of items i..i+items-1, as a list, still one DMA (``tile``: with the tile they are
    views of, ``item_columns``); a packed static pass's items on their score rows, each
    request's row on its own (``st.pack`` table rows an item)."""
    if st.pack > 1:
        return item_columns(st.meta, i, st.R, items, tile, st.pack)
    return item_columns(st.meta, i, max(st.T, st.R) if count else 1, items, tile)


def batched_chunks(st, count, masked):
    """Whether a loop iteration's items load their chunk together (``first_chunks``): flat-list
    items of one masked chunk and one tile of query tokens (decode, verification) on the
    indirect path."""
    return (masked and count == 1 and not st.whole and st.Qb == st.Qt and st.indirect
            and st.scratch is not None)


def first_chunks(st, table, batch):
    """Load the one masked chunk of each of a loop iteration's items ``batch`` together
    (``batched_chunks``), setting each item's ``loads``. What a chunk's gather needs, its cache
    rows with the tokens outside the keys dropped and its score rows' key limits, is computed
    for all the items at once, one instruction a step over [T, W] / [R, W] views of the W items'
    table columns (``table``: the iteration's [parts, W * META_COLS] rows, ``item_row``); per
    item only its page-id DMA, its gathers and its [R, T] mask predicate. The first items'
    gathers are issued here, as many as UPFRONT_BYTES of K and V per partition holds; the
    others' (their ``rows`` and ``keep`` set) by the pipeline, two steps ahead."""
    geo, W = st.geo, len(batch)

    def col(c, parts):                 # column c of every item: [parts, W]
        return table.ap([[W * META_COLS, parts], [META_COLS, W]], offset=c)
    rows = _first_rows(st, col, batch)
    hi, lo = _first_limits(st, col, W)
    _, sources, iota_rt, _, v_dtype, mask, Qt, G, zeros = st.consts
    ahead = max(2, min(W, UPFRONT_BYTES // (2 * st.geo.H * st.D * st.k_bytes)))
    for k in range(W):
        keep = keys_between(iota_rt, hi[:, k:k + 1], None if lo is None else lo[:, k:k + 1])
        if mask is not None:
            masked_keep(mask, mask_start(batch[k].cols, mask), keep, 0, Qt, G)
        if k >= ahead:              # gathered by the pipeline (``loader``), as a static block
            batch[k].rows, batch[k].keep = rows[:, k:k + 1], [keep]
            continue
        tiles = _chunk_tiles(geo, sources[0][0].dtype)
        load_chunk_indirect(tiles, sources, st.kv_indices, None, None, geo, rows[:, k:k + 1],
                            zeros, dropped=True)
        views = _chunk_views(geo, tiles)
        if v_dtype is not None:
            views[1] = converted_v(views[1:], v_dtype)[0]
        batch[k].loads = {"0": [((views[0], views[1]), [keep])]}


def _first_rows(st, col, batch):
    """[T, W] cache rows of the items' chunks (``first_chunks``), tokens outside [WIN, LEN)
    dropped (uint32 when K is gathered transposed): each item's page ids by one DMA from its
    first slot, the rest one instruction a step for all items."""
    geo, T, W = st.geo, st.T, len(batch)
    span, nslots, _ = piece(geo)
    pages = nl.ndarray((T, W), nl.int32, buffer=nl.sbuf, name="first_pages")
    for k in range(W):
        nisa.dma_copy(dst=pages[:, k:k + 1], src=st.kv_indices.ap(
            [[1, nslots], [0, span], [1, 1]], scalar_offset=batch[k].head[0:1, SLOT0:SLOT0 + 1],
            indirect_dim=0))
    entry = nl.ndarray((T, W), nl.int32, buffer=nl.sbuf, name="first_entry")
    nisa.tensor_scalar(dst=entry, data=col(ENTRY0, T), op0=nl.add, operand0=st.tok_sb[:, 1:2],
                       op1=nl.multiply, operand1=geo.entry_stride)
    pos = nl.ndarray((T, W), nl.int32, buffer=nl.sbuf, name="first_pos")
    nisa.tensor_scalar(dst=pos, data=col(POS0, T), op0=nl.add, operand0=st.iota_t)
    ok = nl.ndarray((T, W), nl.int32, buffer=nl.sbuf, name="first_ok")
    nisa.tensor_tensor(dst=ok, data1=pos, data2=col(LEN, T), op=nl.less)
    if st.windowed:
        nisa.tensor_tensor(dst=pos, data1=pos, data2=col(WIN, T), op=nl.greater_equal)
        nisa.tensor_tensor(dst=ok, data1=ok, data2=pos, op=nl.multiply)
    nisa.scalar_tensor_tensor(dst=pages, data=pages, op0=nl.multiply,
                              operand0=geo.rows_per_page, op1=nl.add, operand1=entry)
    drop_invalid(pages, pages, ok)
    return transpose_rows(pages) if geo.kt_dma else pages


def _first_limits(st, col, W):
    """[R, W] ``key_limits`` of the W items' score rows (``col``: ``first_chunks``)."""
    def row_col(c):
        return col(c, st.R)
    return key_limits(st, row_col, W)


def key_limits(st, row_col, width, engine=None, dtype=nl.int32):
    """[R, width] key limits (hi, lo) of items' score rows relative to their first token s =
    POS0 (keys t with lo <= t < hi; lo None without a window): decode rows L - s and W - s; a
    block of queries' rows each their own, from its query qi = row_q (work.py's L_r, W_r).
    ``row_col(c)``: column c of the items' table rows on the R score rows, [R, width];
    ``dtype``: the limits' (fp32 for a ``KeyRange``: positions stay exact below 2^24)."""
    if st.Qb == 1:
        keys = [row_col(LEN), row_col(WIN) if st.windowed else None]
    else:
        keys = list(query_row_keys(row_col, st.row_q[0], st.windowed))
    limits = [None, None]
    for k in range(2):
        if keys[k] is not None:
            limits[k] = nl.ndarray((st.R, width), dtype, buffer=nl.sbuf, name="key_limit")
            if engine is None:
                nisa.tensor_tensor(dst=limits[k], data1=keys[k], data2=row_col(POS0),
                                   op=nl.subtract)
            else:
                nisa.tensor_tensor(dst=limits[k], data1=keys[k], data2=row_col(POS0),
                                   op=nl.subtract, engine=engine)
    return limits[0], limits[1]


def fold_shape(st, count, masked):
    """(tokens per partition of a gather, chunks per softmax step, softmax steps) of an item
    of ``count`` chunks."""
    group = 1 if masked else gathered(st, count)
    if static_block(st, masked, count):   # as many chunks a step as one PSUM bank of scores
        width = static_step_chunks(count, min(PSUM_BANK_BYTES // (4 * st.T),
                                              static_step_limit(st)))
    else:
        width = (step_chunks(st.geo, group) if group > 1 else
                 min(count, FOLD_WIDTH if len(st.tiles) > 1 and st.Qb > 1 else 1))
    return group, width, -(-count // width)      # (a tail's last step may be narrower)


def static_step_limit(st):
    """Most chunks a softmax step of a static pass folds given the rows a core runs: one for
    a single row, two for two (the softmax after a row's last gather is then one short step;
    cost model, trn2, one request of 512-3000 keys 3-9% faster with steps of one chunk, two of
    512-1500 keys 4-5% with steps of two), no limit for more (the steps' fixed costs then
    weigh: 12 x 500-620 keys 135.8 -> 145.2 us with steps of two)."""
    if not in_static_pass(st):
        return STATIC_MAX_CHUNKS
    rows = static_core_rows(st.q.shape[0] // st.Qb, st.cores) // st.pack
    most = rows if rows <= 2 else STATIC_MAX_CHUNKS
    if st.pack > 1:                    # a packed step gathers for each of its requests
        most = max(1, min(most, PACKED_STEP_BYTES // (st.pack * 2 * st.geo.H * st.D
                                                        * st.k_bytes)))
    return most


def static_step_chunks(count, most):
    """Chunks per softmax step of a static block of ``count`` chunks: the largest divisor of
    ``count`` up to ``most`` (the chunks whose fp32 scores fill one PSUM bank)."""
    width = min(count, most)
    while count % width:
        width -= 1
    return width


def loader(st, item, count, masked):
    """load(g, later=None): the (K, V) views and mask predicate of the item's gather g (a
    static block's V gathers left to ``later`` when it is a list, ``k_first``)."""
    group, width, _ = fold_shape(st, count, masked)
    rows, pids, cursor, bounds = item.rows, item.pids, item.cursor, item.bounds

    def load(g, later=None):
        chunks = []
        if group > 1:
            if st.indirect:
                pairs = load_group_indirect(st.sources, rows[:, g:g + 1], st.geo, group,
                                            st.v_dtype)
            else:
                pairs = load_group_pages(st.sources, pids, g * st.T * group // st.page_size,
                                         st.geo, group, st.v_dtype)
            for views in pairs:
                chunks.append((views, None))
            return chunks
        for k in range(g * width, min(count, (g + 1) * width)):
            if item.keep is not None:
                zero_v = ((k + 1 == count or not late_tail(st, count, masked))
                          and not (in_static_pass(st) and k < st.full_slots))
                chunks.append(_load_packed(st, rows, k, count, zero_v, later) if st.pack > 1
                              else _load_rows(st, rows[:, k:k + 1], zero_v, later))
            else:
                chunks.append(_load_chunk(st.consts, st.kv_indices, cursor, bounds, masked,
                                          None if rows is None else rows[:, k:k + 1],
                                          k + 1 == count and not st.whole))
        return chunks
    return load


def static_block(st, masked, count):
    """Whether an item's ``count`` masked chunks load as one block (a static pass's items, a
    flat list's tails, on the indirect path; one tile of query tokens, whose rows share one mask
    predicate): their rows, tokens dropped and mask predicate made once for all of them up
    front, so no chunk's gather waits on the one before."""
    return (masked and (st.scratch is None or count > 1) and not st.whole and st.blocked
            and st.indirect and st.Qb == st.Qt)


def static_block_rows(st, item, count):
    """Set a static block's ``rows`` (``block_rows_of_masked_chunks``) from its page ids
    (``set_cache_rows``), and ``keep`` to an empty list that ``static_block_keep`` fills."""
    item.rows = block_rows_of_masked_chunks(st, item, count)
    item.keep = []


def static_rows(st, first, batch, count):
    """Every static row's ``rows`` at once (a static pass, ``static_block``): the host made the
    [T, W * count] cache rows of table rows ``first``.. (``st.slot_rows``,
    ``work.static_slot_rows``: tokens outside a row's keys at a row past the cache), one DMA
    for all of them, so the first gather waits on no page-id load or address arithmetic (a
    per-row page-id DMA and its descriptors had delayed it by ~0.6 us a row); ``keep`` left
    empty for ``static_block_keep``."""
    per = st.pack * count              # an item's columns: its requests' (packed) side by side
    n = len(batch) * per
    col = first * count if st.slot_col is None else st.slot_col    # sections: set there
    rows = nl.ndarray((st.T, n), nl.int32, buffer=nl.sbuf, name="static_rows")
    nisa.dma_copy(dst=rows, src=st.slot_rows[:, col:col + n])
    if st.geo.kt_dma:               # a gather-transpose's indices are uint32 (all >= 0 here)
        rows = rows.view(nl.uint32)
    for k in range(len(batch)):
        batch[k].rows = rows[:, k * per:(k + 1) * per]
        batch[k].keep = []


def static_block_keep(st, item, count):
    """Fill a static block's ``keep`` ([R, count * T] uint8 mask predicate of the ``count``
    chunks at the item's cursor; ``static_block_rows`` left it empty)."""
    T, R = st.T, st.R
    cols = item.cols
    # score row r keeps the block's tokens s + t (t: st.block_t) with lo_r <= t < hi_r
    def row_col(c):
        return cols[0:R, c:c + 1]
    # on VectorE: a static pass makes them in its pipeline, GpSimd makes its gathers' descriptors
    engine = nisa.engine.vector if in_static_pass(st) else None
    if ranged_keys(st):                # bounds, no predicate tile (``KeyRange``)
        hi, lo = key_limits(st, row_col, 1, engine, nl.float32)
        item.keep.append(KeyRange(hi, lo))
        return
    hi, lo = key_limits(st, row_col, 1, engine)
    keep = keys_between(st.block_t, hi, lo, "block_keep")
    if st.mask is not None:       # each chunk slot's custom-mask bits
        start = mask_start(cols, st.mask)
        for k in range(count):
            masked_keep(st.mask, start, keep[:, k * T:(k + 1) * T], 0, st.Qt, st.G, k)
    item.keep.append(keep)


def block_rows_of_masked_chunks(st, item, count):
    """[T, count] cache rows (tokens outside the item's keys dropped, uint32 when K is gathered
    transposed) of the ``count`` chunks at the item's cursor, from their page ids
    (``item.pids``, ``set_cache_rows``; a static pass: one query tile)."""
    cols = item.cols
    return owned_rows(st, cols, item.pids, cols[0:st.T, POS0:POS0 + 1], count)


def owned_rows(st, cols, pages, first, count):
    """[T, count] cache rows of ``count`` consecutive chunks from their page ids ``pages``
    (``block_pages``), the item's tokens outside [WIN, LEN) dropped (uint32 when K is gathered
    transposed); ``first``: [T, 1] position of the first chunk's first token; ``cols``: the
    item's table row."""
    T = st.T
    rows = rows_of_pages(pages, st.geo, st.entry_rows["1"], unsigned=False)
    pos = nl.ndarray((T, count), nl.int32, buffer=nl.sbuf, name="block_pos")
    nisa.iota(dst=pos, pattern=[[T, count]], offset=0, channel_multiplier=1)
    ok = nl.ndarray((T, count), nl.int32, buffer=nl.sbuf, name="block_ok")
    nisa.tensor_scalar(dst=pos, data=pos, op0=nl.add, operand0=first)
    nisa.tensor_scalar(dst=ok, data=pos, op0=nl.less, operand0=cols[0:T, LEN:LEN + 1])
    if st.windowed:
        nisa.tensor_scalar(dst=pos, data=pos, op0=nl.greater_equal,
                           operand0=cols[0:T, WIN:WIN + 1])
        nisa.tensor_tensor(dst=ok, data1=ok, data2=pos, op=nl.multiply)
    drop_invalid(rows, rows, ok)
    if st.geo.kt_dma:
        rows = transpose_rows(rows)
    return rows


def late_tail(st, count, masked):
    """Whether items of ``count`` masked chunks are decode's late tails (``work.LATE_TAILS``: a
    flat list of one query per item): every chunk but the last is whole, so only the last
    chunk's V tile has rows the gather skips, to be zeroed."""
    return (masked and count == TAIL_CHUNKS and st.Qb == 1 and st.scratch is not None
            and not st.whole)


def in_static_pass(st):
    """Whether the launch is a static pass (``kernel.run_static_pass``: no scratch for states,
    not whole units)."""
    return st.scratch is None and not st.whole


def _load_rows(st, row, zero_v=True, later=None):
    """One chunk of a static block (``row``: its [T, 1] rows, dropped tokens past the cache):
    ((K, V) views, None); skipped V rows read 0 unless not ``zero_v`` (a chunk whose every row
    is gathered: a late tail's whole chunks), zeroed as ``load_chunk_indirect`` does (ScalarE
    copies a zero tile as fp32 words: VectorE, the decode softmax's busier engine, did every
    third chunk's before they were words; now ScalarE alone is faster). ``later``: a list to
    which the V gather is left (``k_first``), K gathered now."""
    geo, sources, _, _, v_dtype, _, _, _, zeros = st.consts
    tiles = _chunk_tiles(geo, sources[0][0].dtype)
    load_chunk_indirect(tiles, sources, st.kv_indices, None, None, geo, row, zeros,
                        dropped=zero_v, parts=(0, 1) if later is None else (0,))
    if later is not None:
        later.append((tiles, row, zero_v))
    views = _chunk_views(geo, tiles)
    if v_dtype is not None:
        views[1] = converted_v(views[1:], v_dtype)[0]
    return (views[0], views[1]), None


# A static pass (and whole units' tails in a loop over units) gathers K one gather ahead of V
# (K0, K1, V0, K2, V1, ..., V(n-1)): a step's scores and softmax run while its V still arrives,
# and after the last byte lands only its P @ V and the outputs remain (K landing last left the
# whole step behind it: cost model, trn2, 1 x 512 keys 11.8 -> 11.0 us, 12 x 500-620 106.1 ->
# 99.0, 32 x 64-2048 510.4 -> 467.6; prefill tails 0.4% faster).
def k_first(st, load, g):
    """Gather g through ``load`` (a ``loader``'s), K first when ``st.later`` is a list (a
    static pass, whole units' tails; gathers of other kinds ignore it): its K now, then the V
    of the gather before it; its own V waits in ``st.later`` for the next gather's K or
    ``flush_later`` (``fold_items`` calls it once no gather is left to issue)."""
    if st.later is None:
        return load(g)
    later = []
    chunks = load(g, later)
    flush_later(st)
    for j in range(len(later)):
        st.later.append(later[j])
    return chunks


def flush_later(st):
    """Issue the V gathers ``k_first`` left in ``st.later``."""
    if st.later is None:
        return
    geo, sources, _, _, _, _, _, _, zeros = st.consts
    for j in range(len(st.later)):
        tiles, row, zero_v = st.later[j]
        load_chunk_indirect(tiles, sources, st.kv_indices, None, None, geo, row, zeros,
                            dropped=zero_v, parts=(1,))
    while len(st.later):
        st.later.pop()


def _load_packed(st, rows, k, count, zero_v, later=None):
    """Chunk slot k of a packed item's requests (``kernel.packed_requests``; ``rows``: their
    [T, count] cache rows side by side): each request's own gathers, as one chunk of the
    tile's virtual heads (``PackedKT`` / ``PackedKV``)."""
    ks, vs = [], []
    for r in range(st.pack):
        views = _load_rows(st, rows[:, r * count + k:r * count + k + 1], zero_v, later)[0]
        ks.append(views[0])
        vs.append(views[1])
    k_view = PackedKT(tuple(ks), st.geo.H) if st.geo.kt_dma else PackedKV(tuple(ks), st.geo.H)
    return (k_view, PackedKV(tuple(vs), st.geo.H)), None


def _chunk_tiles(geo, dtype):
    """SBUF tiles of one chunk's K and V, [T, H*D] each (K as K^T [D, H, T] when gathered
    transposed, ``geo.kt_dma``)."""
    T, H, D = geo.T, geo.H, geo.D
    tiles = [nl.ndarray((T, H * D), dtype, buffer=nl.sbuf, name="k_sb"),
             nl.ndarray((T, H * D), dtype, buffer=nl.sbuf, name="v_sb")]
    if geo.kt_dma:
        tiles[0] = nl.ndarray((D, H, T), dtype, buffer=nl.sbuf, name="kT_sb")
    return tiles


def _chunk_views(geo, tiles):
    """[K, V] views of ``_chunk_tiles``."""
    views = [KVTile(tiles[0], 0, geo.D), KVTile(tiles[1], 0, geo.D)]
    if geo.kt_dma:
        views[0] = KTTile(tiles[0], 0)
    return views


def blocks(st, item, count, masked):
    """A nested loop's body (whole units): the next ``count`` chunks of the item at its cursor,
    folded into its states (a mask-free block's cache rows made per iteration)."""
    def body(_):
        this = item.copy()
        set_cache_rows(st, this, count, masked)
        fold(st, this, count, masked)
    return body


# Flat-list items (decode, verification) of at most this many chunks evict K^T on ScalarE alone
# (VectorE is their busiest engine); larger ones and whole units split it between ScalarE and
# VectorE.
KT_SCALAR_CHUNKS = 2


def kt_vector_share(st, count):
    """VectorE's share of a K^T eviction for an item of ``count`` chunks."""
    return 0.0 if count <= KT_SCALAR_CHUNKS and not st.whole else 0.5


def fold(st, item, count, masked):
    """The item's ``count`` chunks folded into its states (``fold_items`` of one item)."""
    fold_items(st, [item], count, masked)


def fold_items(st, items, count, masked, finished=True, prep=None, fresh=False, diagonal=False):
    """The ``count`` chunks of each of ``items`` (one loop iteration's items of one kind; a
    list: each item's own, whole units' tails of several sizes, whose last step may be
    narrower), ``width`` per softmax step (one [rows, width*T] score tile), software-pipelined
    in program order across the items: gathers run two steps ahead and scores up to
    SCORES_AHEAD tiles ahead of the softmax (a whole step when it has no more tiles), the next
    item's first gathers and scores included, so TensorE makes the next scores while VectorE
    and ScalarE finish these, and the DMAs overlap both. A mask-free block's gathers take
    ``group`` tokens a partition, ``width`` chunks a softmax step (``per_load`` steps a gather).
    Item k-1 is ``finish``ed after item k's first softmax step (its DMAs then sit behind
    gathers already issued) unless not ``finished`` (whole units' tails: their loops follow);
    ``item.loads``: gathers issued before; ``prep(k)``: the queries and masks of items up to k
    (``kernel.static_prep``), PREP_AHEAD items ahead; ``fresh``: blank states (``tail_first``),
    set by the first step; ``diagonal``: tiles keep their keys' columns (``diagonal_columns``)."""
    counts, group, width, per_load, units, order, first_step = _pipeline(st, items, count,
                                                                         masked)
    tiles = st.tiles
    states, loaders, loads = [], [], []
    for i in range(len(items)):
        states.append(_views_of(items[i]))
        loaders.append(loader(st, items[i], counts[i], masked))
        loads.append(items[i].loads if items[i].loads is not None else {})
    kts = {}                                   # K^T by f"{item},{step},{first kv head}"
    K = st.group                               # tiles per group of softmax statistics
    maxima = {}                                # [R, K] row maxima by f"{item},{step},{group}"

    def step(i, s):
        """The chunks of item i's softmax step s, loading them on first use."""
        key = f"{s // per_load[i]}"
        if key not in loads[i]:
            loads[i][key] = k_first(st, loaders[i], s // per_load[i])
        k = (s % per_load[i]) * width[i]
        return loads[i][key][k:k + width[i]]

    def score(v):
        """Scores of unit v = (item, step, tile); K^T of a step's chunks made once per kv
        heads, at their first tile, dropped after their last."""
        i, s, t = units[v]
        _ready(prep, i)
        h0, n = tiles[t][0], tiles[t][1]
        loaded = step(i, s)
        key = f"{i},{s},{h0}"
        if key not in kts:
            kts[key] = []
            share = kt_vector_share(st, counts[i])
            for chunk in loaded:
                kts[key].append(k_transposed(chunk[0][0], h0, n, st.D, st.mm_dtype, share))
        cols = diagonal_columns(st, diagonal, counts[i], width[i], s, t, len(loaded))
        reach = reached_chunks(st, diagonal, counts[i], width[i], s, t, len(loaded))
        keep = _step_keep(st, items[i], loaded[0:reach], t, s * width[i], reach, cols)
        row_max = None
        if K > 1:                         # into its column of the group's row maxima
            if t % K == 0:
                maxima[f"{i},{s},{t // K}"] = nl.ndarray(
                    (st.R, min(K, len(tiles) - t)), nl.float32, buffer=nl.sbuf, name="row_max_g")
            row_max = maxima[f"{i},{s},{t // K}"][:, t % K:t % K + 1]
        if deferred:                      # the PSUM tile, evicted when its step begins
            scores = (raw_scores(items[i].q[t], kts[key], st.T, st.mm_dtype, st.pack), keep,
                      row_max)
        else:
            scores = chunk_scores(items[i].q[t], kts[key][0:reach], st.T, keep, st.scale,
                                  st.soft_cap, st.mm_dtype, st.keep_all, row_max,
                                  st.mask is None, st.pack, cols)
        if t + 1 == len(tiles) or tiles[t + 1][0] != h0:
            kts.pop(key)                  # its tiles are free from here on
        return scores

    total, ahead = len(units), min(len(tiles), SCORES_AHEAD)
    deferred = deferred_eviction(st)
    for j in range(min(2, len(order))):
        step(order[j][0], order[j][1])
    _ready(prep, PREP_AHEAD)
    pending = []
    for v in range(min(ahead, total)):
        pending.append(score(v))
    halves, owners, lag = [], [], end_lag(st, group)   # begun steps not yet ended, their items
    for v in range(total):
        i, s, t = units[v]
        u = s * len(tiles) + t            # the unit's place in its item
        if t == 0 and first_step[i] + s + 2 < len(order):
            step(order[first_step[i] + s + 2][0], order[first_step[i] + s + 2][1])
        elif t == 0:                      # no gather left to go before the last V
            flush_later(st)
        if u == 0:
            _ready(prep, i + 1 + PREP_AHEAD)
        if v + ahead < total:
            pending.append(score(v + ahead))
        if K > 1 and t % K == 0:          # the group's running max at its first tile
            n = min(K, len(tiles) - t // K * K)
            stats = group_stats(bank_column(items[i].bank, st.D, 0, t, n),
                                maxima.pop(f"{i},{s},{t // K}"), st.scale,
                                st.state_copy_engine, fresh and s == 0)
        first = s == 0 and (fresh or (st.first_init and not items[i].chained))
        owners.append(i)
        scores = pending.pop(0)
        if deferred:                      # (s_ps, keep, row max) made ahead, evicted now
            scores = evict_scores(scores[0], scores[1], st.scale, st.soft_cap, st.keep_all,
                                  scores[2], st.mask is None)
        views = _v_views(step(i, s))
        views = views[0:reached_chunks(st, diagonal, counts[i], width[i], s, t, len(views))]
        halves.append(softmax_begin(states[i][t], scores, tiles[t][1],
                                    views, tiles[t][0], st.D, st.mm_dtype,
                                    st.state_copy_engine,
                                    _stats_column(stats, t % K) if K > 1 else None, st.dma_pT,
                                    first, acc_on_gpsimd(st, tiles[t])))
        if K > 1 and t % K == n - 1:      # every tile of the group begun: its sums
            group_sums(bank_column(items[i].bank, st.D, 1, t - n + 1, n), stats)
        if len(halves) > lag:
            owners.pop(0)
            softmax_end(halves.pop(0))
        if t + 1 == len(tiles) and s % per_load[i] == per_load[i] - 1:
            loads[i].pop(f"{s // per_load[i]}")  # its tiles are free from here on
        if u + 1 == len(tiles) and i > 0:
            while owners and owners[0] < i:      # the previous item's last steps, ended
                owners.pop(0)
                softmax_end(halves.pop(0))
            if finished:
                finish(st, items[i - 1])         # (see items_iteration)
    for half in halves:
        softmax_end(half)


# Columns a tile's narrowed softmax step keeps come in multiples of this (``diagonal_columns``)
DIAGONAL_COLUMNS = 32


def diagonal_columns(st, diagonal, count, width, s, t, have):
    """Of the ``have`` chunks of softmax step s of a whole unit's tail of ``count`` chunk slots
    (``width`` a step), the score columns query tile t keeps: all ``have * T`` unless
    ``diagonal``; else the ones its causal keys can reach, in multiples of DIAGONAL_COLUMNS,
    at least one multiple. A tail ends at its unit's keys' end LEN (its last slot holds key
    LEN - 1 or lies past it), and a unit's query rows end at its last query
    (``work.right_aligned``: row qi at position LEN - Qb + qi), so tile t's rows (q0 .. q0 +
    Qt - 1) need no tail slot from count * T - Qb + q0 + Qt on, whatever LEN is. The step's
    first columns are the ones kept: every row's softmax state sees each step (a row with no
    key there is wiped by the rescale, as any masked row is)."""
    if not diagonal:
        return have * st.T
    q0 = st.tiles[t][2]
    reach = count * st.T - st.Qb + q0 + st.Qt - s * width * st.T
    reach = -(-reach // DIAGONAL_COLUMNS) * DIAGONAL_COLUMNS
    return max(DIAGONAL_COLUMNS, min(have * st.T, reach))


def reached_chunks(st, diagonal, count, width, s, t, have):
    """The chunks ``diagonal_columns``' columns touch (the last one perhaps in part)."""
    return -(-diagonal_columns(st, diagonal, count, width, s, t, have) // st.T)


def _pipeline(st, items, count, masked):
    """``fold_items``' layout of ``items`` (``count``: chunks of each, or one for all): per item
    its chunk count, chunks per softmax step and softmax steps per load; the gathers' tokens
    per partition (1 for masked items, whatever their counts); the pipeline's units (item,
    step, tile) in order, its (item, step) pairs, and each item's first pair."""
    counts, width, per_load, units, order, first_step = [], [], [], [], [], []
    group = None
    for i in range(len(items)):
        counts.append(count[i] if isinstance(count, (list, tuple)) else count)
        group, w, steps = fold_shape(st, counts[i], masked)
        width.append(w)
        first_step.append(len(order))
        for s in range(steps):
            order.append((i, s))
            for t in range(len(st.tiles)):
                units.append((i, s, t))
    for i in range(len(items)):
        per_load.append(max(1, group // width[i]))
    return counts, group, width, per_load, units, order, first_step


def _stats_column(stats, k):
    """Column k of a group's ``group_stats`` (alpha None on a fresh first step)."""
    column = []
    for part in stats:
        column.append(None if part is None else part[:, k:k + 1])
    return column


def _ready(prep, k):
    """Items up to k of ``fold_items`` have their queries and mask (``prep`` makes each once)."""
    if prep is not None:
        prep(k)


def _views_of(item):
    """[negm, l, acc] views of each of the item's state tiles."""
    views = []
    for t in item.states:
        views.append(state_views(t))
    return views


def deferred_eviction(st):
    """Whether ``fold_items`` makes a step's scores ahead but evicts them only when the step
    begins: one query a row and one tile a step (decode), NeuronCore-v3+. ScalarE and VectorE
    then run this step's softmax while TensorE makes the next step's scores (evicted ahead, the
    next scores' chain sat in front of this step's softmax on both in-order engines: 12 x
    500-620 keys 152.6 -> 135.8 us; verification and trn1 lost 0.1-0.8% with it)."""
    return (len(st.tiles) == 1 and st.Qb == 1
            and nisa.get_nc_version() >= nisa.nc_version.gen3)


def end_lag(st, group):
    """Units a softmax step's end lags its begin in ``fold_items``: one (with P^T by DMA,
    DMA_PT_LAG, or DMA_PT_LAG_FEW for steps of few tiles), so VectorE never waits on this unit's
    exp, unless a gather's V tile (``group`` tokens a partition) is large: it is not held past
    its own step (decode too since its masked items load together, first_chunks: eight spread
    and uniform decode steps 1.5% faster)."""
    if group * st.geo.H * st.D * st.k_bytes > LAG_TILE_BYTES:
        return 0
    if not st.dma_pT:
        return 1
    return DMA_PT_LAG_FEW if len(st.tiles) <= DMA_PT_FEW_TILES else DMA_PT_LAG


def acc_on_gpsimd(st, tile):
    """Whether ``tile`` (first kv head, kv heads, first query token) of a whole unit rescales its
    accumulator on GpSimd (``kernel_softmax.gpsimd_rescale``): one kv head's tiles, every
    second kv head (VectorE and ScalarE then carry about equal work: cost model, trn2, prefill
    256 over 1280 keys 238 -> 221 us, 512 over 4608 1214 -> 1115; all of them: ScalarE binds,
    227 and 1161), units of several query tiles a kv head (a cascade's shared level, one tile
    of 32 queries a head, waits on each step's chain instead: 260 -> 269 us); NeuronCore-v3+."""
    return (st.whole and tile[1] == 1 and tile[0] % 2 == 0 and st.Qb > st.Qt
            and nisa.get_nc_version() >= nisa.nc_version.gen3)


def finish(st, item):
    """Chain the item's state onto its unit's (scratch slot LOAD: the unit's earlier items, or
    the identity; a ``chained`` item started from it, a fresh one has none: its LOAD is
    None), keep it in slot STORE and write the
    unit's output and LSE (a later item of the unit writes them again). With a custom mask the
    rows that saw no key so far are cleared before the store (``forget_unseen``: a later merge
    weighs them by e^(-NEG_BIG) = 0 either way), so the output's finalize never waits on the
    store's read of the state."""
    banked_item = item.bank is not None and not st.whole
    merges = not item.chained and item.load is not None
    if banked_item and merges:
        _, kept = load_bank(st.scratch, item.load, st.R, len(st.tiles))
        for t in range(len(st.tiles)):
            merge_states(item.states[t], kept[t])
    for t in range(len(st.tiles)):
        if st.scratch is None:     # a static pass: the item is its unit's only one
            break
        tile = item.states[t]
        if merges and not banked_item:
            kept = load_state(st.scratch, item.load, t, st.R, st.tiles[t][1] * st.GQ)
            merge_states(tile, kept)
        if st.mask is not None:
            forget_unseen(state_views(tile), st.exp_scale)
        if not banked_item:
            store_state(st.scratch, item.store, t, st.R, tile)
    if banked_item:                # side-by-side tiles: one DMA each way
        store_bank(st.scratch, item.store, item.bank, len(st.tiles))
    write(st, item.states, item.b, item.bank if banked_item else None,
          forgotten=st.scratch is not None)


def write(st, states, b, bank=None, forgotten=False):
    """Output rows and LSE of unit output row ``b`` from its states (one per tile; ``bank``:
    the ``state_bank`` they are views of, finalized at once when there are no sinks);
    ``forgotten``: a custom mask's unseen rows already cleared (``finish``)."""
    if st.mask is not None and not forgotten:
        for t in range(len(st.tiles)):
            forget_unseen(state_views(states[t]), st.exp_scale)
    if bank is not None and st.sinks is None:
        finalize_bank(bank, st.tiles, st.out, st.lse, b, st.G, st.Qt, st.v_scale)
        return
    for t in range(len(st.tiles)):
        h0, n, q0 = st.tiles[t]
        finalize(state_views(states[t]), st.out, st.lse, st.sinks, b, h0, st.G, st.Qt,
                 st.v_scale, q0)


def merge_split(st, states, b, bank=None):
    """LNC=2: this core's part of the unit split between the cores merged with the other's
    (both end with the merged states); program 0 writes the unit."""
    if bank is not None:
        merge_bank_with_partner(bank, st.D, st.p)
    else:
        for tile in states:
            merge_with_partner(tile, st.p)
    if st.p == 0:
        write(st, states, b, bank)


def unit(st, i, diagonal=True):
    """Whole unit i: its chunks in loops nested in the item, masked ones in pairs and the mask-free
    ones in CHUNK_BLOCKS of 2 chunks or more (as many of each size as fit, largest first); an odd
    mask-free chunk left over joins the masked chunks after it (masked by bounds that keep all
    its keys), saving its own loop's barrier and pipeline fill; the chunks from C1 on, a tail
    of ``st.unit_tail`` slots, fold first without a loop (``work.with_unit_tail``). Returns the
    item, its states complete."""
    items, _ = unit_group_begin(st, i, 1, diagonal=diagonal)
    return unit_loops(st, items[0])


def unit_setup(st, i, slot, slots):
    """A whole unit's setup: (the item, its tail of ``slots`` chunk slots: a view of it over
    the tail's chunks, or None without tails), nothing folded yet."""
    item = prepare(st, i, 1, True, slot=slot)
    if not st.unit_tail:
        return item, None
    tail = item.copy()
    tail.rows, tail.keep = unit_tail_block(st, item, slots)
    return item, tail


# The tails whose first gather is issued right after their own unit's setup rather than after
# the whole group's: the group's first gathers then wait on one setup, not four (the setups'
# small instructions queue on GpSimd, which also makes the gathers' descriptors). One, not two:
# the second unit's gather took the DMA engines the first unit's queries and gathers wanted
# (cost model, trn2, thirteen multi-unit prefill launches 7486.8 -> 7445.4 us LNC=1, 3879.5 ->
# 3853.3 LNC=2; twelve chunks of 96 over 100-1000 keys 446.2 -> 438.2 / 222.8 -> 219.5); two
# for units of WIDE_UNIT_TILES score tiles or more, whose setups are long (seven launches of
# 128-512 queries a unit 4794.3 -> 4783.7 / 2524.1 -> 2520.0)
TAIL_GATHERS_AHEAD = 1
WIDE_UNIT_TILES = 48


def tail_gathers_ahead(st):
    """How many of a group's tails issue their first gather with their own unit's setup."""
    if len(st.tiles) >= WIDE_UNIT_TILES:
        return TAIL_GATHERS_AHEAD + 1
    return TAIL_GATHERS_AHEAD


def unit_group_begin(st, i, n, slots=None, diagonal=True):
    """Whole units i .. i+n-1 of one loop iteration set up (``unit_group_setup``), then their
    tails folded (``unit_group_fold``); returns the items, their loops still to run
    (``unit_loops``), and the chunks the group's rounds took."""
    items, tails, sizes = unit_group_setup(st, i, n, slots)
    return unit_group_fold(st, items, tails, sizes, diagonal)


def unit_group_setup(st, i, n, slots=None):
    """Whole units i .. i+n-1 set up (their rows, queries, states, tails' cache rows and
    bounds; the first ``tail_gathers_ahead`` tails' first gathers issued with their setups),
    nothing folded: (items, tails, each tail's slots: ``slots``, one for all or per unit,
    ``st.unit_tail`` when None)."""
    if slots is None:
        slots = st.unit_tail
    sizes = []                         # per unit (``work.tail_profile``), or one for all
    for k in range(n):
        sizes.append(slots[k] if isinstance(slots, tuple) else slots)
    items, tails = [], []
    for k in range(n):
        item, tail = unit_setup(st, i + k, k, sizes[k])
        items.append(item)
        if tail is not None and k < tail_gathers_ahead(st):   # before the next unit's setup
            tail.loads = {"0": k_first(st, loader(st, tail, sizes[k], True), 0)}
        if tail is not None:
            tails.append(tail)
    return items, tails, sizes


def unit_group_fold(st, items, tails, sizes, diagonal=True):
    """``unit_group_setup``'s units' tails folded as one software pipeline (``fold_items``: a
    unit's tail gathers while the one before it computes), then their rounds
    (``group_rounds``); returns (items, the chunks the rounds took or None).
    ``diagonal``: each tile scores only the tail chunks its causal keys reach
    (``diagonal_columns``; False for a core's part of a unit split between the cores, whose
    tail may end before the unit's keys do)."""
    if tails:
        fold_items(st, tails, sizes[0:len(tails)], True, finished=False, fresh=tail_first(st),
                   diagonal=diagonal)
    taken = None
    if len(items) > 1 and st.unit_tail and st.blocked and st.indirect:
        taken = group_rounds(st, items)
    return items, taken


def group_rounds(st, items):
    """Rounds of a loop iteration's whole units: each round folds, for every unit at once (one
    software pipeline, ``fold_items``), one mask-free block of its chunks before its tail, the
    blocks of ROUND_CHUNKS chunks first (ROUNDS rounds), then the ROUNDS1 single chunks, two a
    round and the odd one alone (the host counts each single chunk as a round all the same: its
    choice measured better so),
    each round's blocks just before the last round's (the host's counts for the iteration,
    ``work.with_rounds``; the least of its rows', which keeps every unit's rounds within its own
    mask-free chunks should the host's groups ever differ from these); each unit's own loops
    then end where its rounds begin (``unit_loops``). A short prefix then costs the units one
    loop iteration between them instead of one each. Returns the chunks the rounds took of
    each unit (a device scalar)."""
    per = st.T // st.page_size                 # page-list slots per chunk
    slots = []                                 # per unit: the next round's first page-list slot
    for item in items:                         # (the host's, moved back a round at a time)
        slots.append(item.cols[0:1, ROUND_SLOT:ROUND_SLOT + 1])
    least = nl.ndarray((1, 2), nl.int32, buffer=nl.sbuf, name="rounds")   # ROUNDS, ROUNDS1
    nisa.tensor_copy(dst=least, src=items[0].cols[0:1, ROUNDS:ROUNDS + 2],
                     engine=nisa.engine.gpsimd)
    for item in items[1:]:
        nisa.tensor_tensor(dst=least, data1=least, data2=item.cols[0:1, ROUNDS:ROUNDS + 2],
                           op=nl.minimum)
    fours = nisa.scalar_load(least[0:1, 0:1])
    nl.fori_loop(0, fours, _rounds(st, items, slots, ROUND_CHUNKS))
    for slot in slots:                         # the two chunks just before the last round's block
        nisa.tensor_scalar(dst=slot, data=slot, op0=nl.add, operand0=(ROUND_CHUNKS - 2) * per,
                           engine=nisa.engine.gpsimd)
    ones = nisa.scalar_load(least[0:1, 1:2])
    twos = ones // 2                           # single chunks two a round, then the odd one
    nl.fori_loop(0, twos, _rounds(st, items, slots, 2))
    for slot in slots:                         # the chunk just before the last round's block
        nisa.tensor_scalar(dst=slot, data=slot, op0=nl.add, operand0=per,
                           engine=nisa.engine.gpsimd)
    nl.fori_loop(0, ones - twos * 2, _rounds(st, items, slots, 1))
    return fours * ROUND_CHUNKS + ones


def _rounds(st, items, slots, count):
    """A round's body: every unit's mask-free block of ``count`` chunks at its slot, folded
    together, then each slot moved back ``count`` chunks."""
    group = gathered(st, count)
    per = st.T // st.page_size

    def body(_):
        now = []
        for k in range(len(items)):
            this = items[k].copy()
            this.cursor = {"slot": slots[k]}
            this.rows = block_rows(st.kv_indices, this.cursor, count, st.geo, group,
                                   st.entry_rows[f"{group}"], moves=False)
            this.pids, this.keep, this.loads = None, None, None
            now.append(this)
        fold_items(st, now, count, False, finished=False)
        for slot in slots:
            nisa.tensor_scalar(dst=slot, data=slot, op0=nl.add, operand0=-count * per,
                               engine=nisa.engine.gpsimd)
    return body


def unit_loops(st, item, taken=None):
    """A whole unit's chunks before its tail, in loops (``unit``), those before the last
    ``taken`` when its iteration's rounds folded them (``group_rounds``); returns the item."""
    cols = item.cols
    c0 = nisa.scalar_load(cols[0:1, C0:C0 + 1])
    full_lo = nisa.scalar_load(cols[0:1, FULL_LO:FULL_LO + 1])
    full_hi = nisa.scalar_load(cols[0:1, FULL_HI:FULL_HI + 1])
    c1 = nisa.scalar_load(cols[0:1, C1:C1 + 1])
    if taken is not None:              # the rounds took the mask-free chunks up to the tail
        full_hi = full_hi - taken
        c1 = c1 - taken
    masked_pairs(st, item, c0, full_lo)
    lo = full_lo
    for size in CHUNK_BLOCKS:
        if size > 1:
            hi = lo + ((full_hi - lo) // size) * size
            nl.fori_loop(lo, hi, blocks(st, item, size, False), step=size)
            lo = hi
    masked_pairs(st, item, lo, c1)
    return item


def unit_tail_block(st, item, count):
    """A whole unit's tail (``work.with_unit_tail``): ([T, count] cache rows of the ``count``
    chunks from chunk C1, tokens outside [WIN, LEN) dropped, uint32 when K is gathered
    transposed; per tile of query tokens its [R, count * T] mask predicate), from one page-id
    DMA and one instruction a step for all the chunks: none waits on the loops' cursor, so
    the tail's gathers are issued with the unit's queries. ``st.block_t``: the token columns."""
    T, P, R = st.T, st.page_size, st.R
    cols = item.cols
    slot = (nisa.scalar_load(cols[0:1, SLOT0:SLOT0 + 1])
            + (nisa.scalar_load(cols[0:1, C1:C1 + 1])
               - nisa.scalar_load(cols[0:1, C0:C0 + 1])) * (T // P))
    per = T // P                       # pages per chunk (pages of at most 128 tokens)
    pages = nl.ndarray((T, count), nl.int32, buffer=nl.sbuf, name="tail_pages")
    nisa.dma_copy(dst=pages, src=st.kv_indices.ap([[1, per], [0, P], [per, count]],
                                                  scalar_offset=slot, indirect_dim=0))
    first = nl.ndarray((max(T, R), 1), nl.int32, buffer=nl.sbuf, name="tail_first")
    nisa.tensor_scalar(dst=first, data=cols[0:max(T, R), C1:C1 + 1], op0=nl.multiply,
                       operand0=T)
    rows = owned_rows(st, cols, pages, first[0:T, :], count)
    keep = []                          # row r keeps tokens first + t with W_r <= . < L_r
    ranged = ranged_keys(st)           # (fp32 limits: positions stay exact below 2^24)
    limit = nl.float32 if ranged else nl.int32
    for bounds in item.bounds:
        hi = nl.ndarray((R, 1), limit, buffer=nl.sbuf, name="tail_hi")
        nisa.tensor_tensor(dst=hi, data1=bounds.L_r, data2=first[0:R, :], op=nl.subtract)
        lo = None
        if bounds.W_r is not None:
            lo = nl.ndarray((R, 1), limit, buffer=nl.sbuf, name="tail_lo")
            nisa.tensor_tensor(dst=lo, data1=bounds.W_r, data2=first[0:R, :], op=nl.subtract)
        if ranged:
            keep.append(KeyRange(hi, lo))
        else:
            keep.append(keys_between(st.block_t[:, 0:count * T], hi, lo, "tail_keep"))
    return rows, keep


def ranged_keys(st):
    """Whether blocks of queries (whole units' tails, verification's static blocks) select their
    keys by bounds (``KeyRange``: one ``range_select`` a step, no predicate tile made on VectorE
    first): NeuronCore-v3+, no soft cap and no custom mask (their selections take a
    predicate). A row range_select masks whole gets FP32_MIN, not -inf, so its step sums to
    its width: wiped (alpha 0) once the row sees a key, which every real row of a query block
    does (a request's keys hold its queries); one query a row (decode) may see none (no keys
    at all: its LSE must be -inf), so it keeps the predicate."""
    return (st.Qb > 1 and st.soft_cap <= 0 and st.mask is None
            and nisa.get_nc_version() >= nisa.nc_version.gen3)


def masked_pairs(st, item, a, e):
    """The masked chunks [a, e) of a whole unit, two per loop iteration (one softmax step of both,
    their predicates side by side) and the odd one alone: half the loop barriers and pipeline
    fills of one chunk an iteration."""
    pairs = a + ((e - a) // 2) * 2
    nl.fori_loop(a, pairs, blocks(st, item, 2, True), step=2)
    nl.fori_loop(pairs, e, blocks(st, item, 1, True))


def _step_keep(st, item, loaded, t, c0, width, cols=None):
    """The mask predicate of tile t's softmax step over the item's chunks c0..c0+width
    (``loaded``): a static block's columns of its predicate (its first ``cols`` when given:
    ``diagonal_columns``), a masked step's chunks' predicates side by side, or None
    (mask-free)."""
    rows = st.tiles[t][1] * st.GQ
    j = st.tiles[t][2] // st.Qt                # the tile's query tokens
    if item.keep is not None and isinstance(item.keep[j], KeyRange):
        return item.keep[j].window(rows, c0 * st.T)
    if item.keep is not None:
        return item.keep[j][0:rows, c0 * st.T:c0 * st.T + (cols or width * st.T)]
    if loaded[0][1] is not None:
        return _joined_keep(loaded, j, rows, st.T)
    return None


def _joined_keep(loaded, j, rows, T):
    """The mask predicate of a softmax step's masked chunks for query tile j: the chunk's own
    [rows, T] when the step has one chunk, else the chunks' side by side in one [rows, W*T]."""
    if len(loaded) == 1:
        return loaded[0][1][j][0:rows, :]
    joined = nl.ndarray((rows, len(loaded) * T), nl.uint8, buffer=nl.sbuf, name="keep_joined")
    for c in range(len(loaded)):
        nisa.tensor_copy(dst=joined[:, c * T:(c + 1) * T], src=loaded[c][1][j][0:rows, :],
                         engine=nisa.engine.gpsimd)
    return joined


def _v_views(chunks):
    """The V views of loaded chunks ((K, V), keep), as a list (a temporary: the simulator frees
    a tile when its last reference goes, as the compiler frees it after its last use)."""
    views = []
    for chunk in chunks:
        views.append(chunk[0][1])
    return views


def _load_chunk(consts, kv_indices, cursor, bounds, masked, rows=None, last=False):
    """Gather the cursor's chunk ((K, V) KVTile pair of tiles [T, H*D], the mask predicates when
    masked), then advance the cursor; ``rows``: the chunk's cache rows from ``block_rows``
    (which advanced the cursor already); ``last``: the cursor's last chunk (a flat-list item's
    cursor ends with it), not advanced."""
    geo, sources, iota_rt, indirect, v_dtype, mask, Qt, G, zeros = consts
    T, H, D = geo.T, geo.H, geo.D
    tokens = bounds[0]                        # token-level bounds: the same for every tile
    valid_t = token_validity(cursor, tokens) if masked else None
    dtype = sources[0][0].dtype
    if not indirect and sources[0][0] is sources[1][0]:      # fused cache: one DMA per page
        kv = nl.ndarray((T, 2 * H * D), dtype, buffer=nl.sbuf, name="kv_sb")
        load_chunk_pages([kv], sources, kv_indices, cursor, tokens, valid_t, geo)
        views = [KVTile(kv, 0, D), KVTile(kv, H * D, D)]
    else:
        kv_tiles = _chunk_tiles(geo, dtype)      # K^T by the gather: indirect only
        if indirect:
            load_chunk_indirect(kv_tiles, sources, kv_indices, cursor, valid_t, geo, rows, zeros)
        else:
            load_chunk_pages(kv_tiles, sources, kv_indices, cursor, tokens, valid_t, geo)
        views = _chunk_views(geo, kv_tiles)
    keep = None
    if masked:                     # per tile of query tokens, as ``bounds``
        keep = []
        for j in range(len(bounds)):
            keep.append(mask_keep(cursor, bounds[j], iota_rt))
            if mask is not None:
                masked_keep(mask, cursor["mrow"], keep[j], j * Qt, Qt, G)
    if rows is None and not last:
        advance(cursor, geo.page_size)
    if v_dtype is not None:        # fp8 V as a matmul input before NeuronCore-v4: converted
        views[1] = converted_v(views[1:], v_dtype)[0]
    return (views[0], views[1]), keep
