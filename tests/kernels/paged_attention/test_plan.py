"""The host plan (plan.py) against its meaning, without the simulator: decode every work-item row
back into the keys each query row may see and compare with FlashInfer's rules computed here one
query at a time; check the chunk ranges the kernel loops over (masked / mask-free), the page
addressing columns, the split into kinds of work item, their softmax-state chains, the LNC=2
cut and the spans of each core's loops. Fast: these run under mutation
testing of plan.py (docs/contributing.md)."""

import numpy as np
import pytest

from nki_kernels.paged_cache.layout import CacheGeometry
from nki_kernels.paged_attention import work as work_module
from nki_kernels.paged_attention.work import (
    C0, C1, CHUNK_BLOCKS, CUT_ITEM_COST_CHUNKS, CUT_ITERATION_COST_CHUNKS, DECODE_ITEMS_PER_ITERATION, ENTRY0, FULL_HI, FULL_LO, HI_BASE,
    ITEM_CLASSES, ITEM_COST_CHUNKS, ITERATION_COST_CHUNKS, LEN, LOAD, MASKED_AGAIN, META_COLS,
    NO_WINDOW, OUT, TAIL, TAIL_CHUNKS,
    NEXT, POS0, PTR, Q_BASE, SLOT0, STORE, W_SPAN, WHOLE_UNIT_SPAN_COLS,
    WIN, capacity_chunks, causal_pairs, chunk_tokens,
    _kind_counts, _part_items, class_items, core_rows, decode_work, items_per_iteration,
    loop_widths, token_table,
    query_blocks, request_table, span_cols, span_column, span_start, split_work, starts_fresh, state_slots,
    table_rows,
    whole_units)

U = DECODE_ITEMS_PER_ITERATION              # decode items per loop iteration


def _visible(kv_len, q_len, qi, window_left, causal):
    """[lo, hi) of the keys query qi of a request sees (FlashInfer: positions kv - q_len + qi)."""
    pos = kv_len - q_len + qi
    hi = min(pos + 1, kv_len) if causal else kv_len
    lo = max(0, pos - window_left) if window_left >= 0 else 0
    return lo, max(hi, 0)


def _row_keys(row, qi):
    """The kernel's reading of a meta row: query row qi's keys [W_r, L_r)."""
    hi = min(int(row[HI_BASE]) + qi, int(row[LEN]))
    lo = max(0, int(row[Q_BASE]) + qi - int(row[W_SPAN]))
    return lo, hi


def _random_batch(rng, page_size):
    B = int(rng.integers(1, 7))
    kv = rng.integers(0, 3 * 128 + 40, B)
    ql = np.minimum(rng.integers(0, 300, B), kv)
    ql[rng.random(B) < 0.4] = 1
    ql = np.minimum(ql, kv)
    pages = -(-kv // page_size)
    indptr = np.concatenate([[0], np.cumsum(pages + rng.integers(0, 3, B))]).astype(np.int64)
    return indptr, kv, ql


CASES = [(seed, P, qb, w, causal) for seed in range(4) for P in (1, 5, 16, 128, 256)
         for qb in (1, 8, 32) for w in (-1, 0, 100, 129) for causal in (True, False)]


@pytest.mark.parametrize("seed,page_size,q_block,window_left,causal", CASES)
def test_items_cover_exactly_the_visible_keys(seed, page_size, q_block, window_left, causal):
    rng = np.random.default_rng(seed * 7919 + page_size)
    _check_items(*_random_batch(rng, page_size), q_block, window_left, causal, page_size)


@pytest.mark.parametrize("window_left", [-1, 50])
@pytest.mark.parametrize("causal", [True, False])
def test_requests_with_no_queries_or_no_keys_gather_nothing(window_left, causal):
    """q_len 0 (a request with nothing new this step) and kv_len 0 beside real ones."""
    kv, ql = np.array([300, 0, 129, 77, 0]), np.array([0, 0, 129, 5, 0])
    indptr = np.concatenate([[0], np.cumsum(-(-kv // 16))])
    for q_block in (1, 8):
        _check_items(indptr, kv, ql, q_block, window_left, causal, 16)


@pytest.mark.parametrize("q_block", [8, 32])
def test_window_edges_of_partial_query_blocks_sweep_a_chunk(q_block):
    """The last block of a request is partial: its mask-free range starts after the window of
    its last real query, not of a full block; kv lengths sweep a whole chunk so that window
    start crosses a chunk boundary."""
    for kv in range(400, 400 + 128, 3):
        kv_arr, ql = np.array([kv]), np.array([37])
        _check_items(np.array([0, -(-kv // 16)]), kv_arr, ql, q_block, 150, True, 16)


def _check_items(indptr, kv, ql, q_block, window_left, causal, page_size):
    T = chunk_tokens(page_size)
    req = query_blocks(indptr, kv, ql, q_block, window_left, causal, page_size)
    rows = req.items(np.arange(req.L.size), req.c0, req.c1, page_size)
    assert rows.shape == (req.L.size, META_COLS)
    item = 0
    for b in range(kv.size):
        blocks = max(1, -(-int(ql[b]) // q_block))
        for k in range(blocks):
            row = rows[item]
            assert int(req.request[item]) == b and int(req.q0[item]) == k * q_block
            assert row[OUT] == item * q_block and row[PTR] == indptr[b]
            real = range(min(q_block, int(ql[b]) - k * q_block))
            spans = []
            for qi in real:
                want = _visible(int(kv[b]), int(ql[b]), k * q_block + qi, window_left, causal)
                got = _row_keys(row, qi)
                if want[1] > want[0]:
                    assert got == want, (b, k, qi)
                    spans.append(want)
                else:
                    assert got[1] <= got[0], (b, k, qi)
            c0, lo, hi, c1 = (int(row[c]) for c in (C0, FULL_LO, FULL_HI, C1))
            assert c0 <= lo <= hi <= c1
            if not spans:                                    # nothing to see: no chunk at all
                assert c0 == c1 == 0 and row[LEN] == 0 and row[WIN] == 0
            else:
                W, L = min(s[0] for s in spans), max(s[1] for s in spans)
                assert (row[WIN], row[LEN]) == (W, L)
                assert (c0, c1) == (W // T, -(-L // T))      # the fewest chunks holding them
                inside = [c for c in range(c0, c1)
                          if all(s[0] <= c * T and (c + 1) * T <= s[1] for s in spans)]
                # mask-free: exactly the chunks every real row sees whole (they are contiguous)
                assert inside == list(range(lo, hi)), (b, k, inside, lo, hi)
            assert row[POS0] == c0 * T and row[SLOT0] == indptr[b] + c0 * T // page_size
            assert row[ENTRY0] == (c0 * T) % page_size
            assert row[W_SPAN] == (window_left + 1 if window_left >= 0 else NO_WINDOW)
            item += 1
    assert item == req.L.size


def test_decode_rows_are_one_item_per_request_and_padding_is_empty():
    indptr, kv = np.array([0, 3, 3, 9]), np.array([40, 0, 90])
    table = request_table(indptr, kv, -1, 16, 5)
    assert table.dtype == np.int32 and table.shape == (5, META_COLS)
    np.testing.assert_array_equal(table[:3, LEN], kv)
    np.testing.assert_array_equal(table[:3, OUT], [0, 1, 2])
    np.testing.assert_array_equal(table[:3, PTR], [0, 3, 3])
    np.testing.assert_array_equal(table[:3, C1], [1, 0, 1])
    assert not table[3:].any()


@pytest.mark.parametrize("page_size,chunk", [(1, 128), (3, 126), (16, 128), (48, 96), (100, 100),
                                             (128, 128), (256, 128), (384, 128)])
def test_chunk_tokens_and_token_table(page_size, chunk):
    assert chunk_tokens(page_size) == chunk
    tab = token_table(page_size)
    assert tab.shape == (chunk, 2) and tab.dtype == np.int32
    t = np.arange(chunk)
    if page_size <= 128:
        np.testing.assert_array_equal(tab[:, 0] * page_size + tab[:, 1], t)
        assert (tab[:, 1] < page_size).all()
    else:
        np.testing.assert_array_equal(tab, np.stack([np.zeros_like(t), t], 1))


@pytest.mark.parametrize("page_size", [129, 200, 300])
def test_page_sizes_above_128_must_be_multiples_of_128(page_size):
    with pytest.raises(ValueError, match=f"page_size={page_size}"):
        chunk_tokens(page_size)


@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("fused", [True, False])
def test_layout_rows_address_every_token(layout, fused):
    """Row p * page + e * entry (+ the V offset for V) is where the layout puts token e of page
    p, head 0, in rows of D elements."""
    geo = CacheGeometry(7, 5, 3, 8, layout, fused)
    page, entry, v_rows = geo.d_row_strides
    assert all(type(x) is int for x in geo.d_row_strides)  # static kernel arguments: exact ints
    for p in range(7):
        for e in range(5):
            for kv in (0, 1) if fused else (0,):
                row = p * page + e * entry + kv * v_rows
                assert row * geo.head_dim == geo.start(p, e, kv)


def test_items_per_iteration_by_bucket():
    """Sixteen decode or verification items share a loop iteration whatever the batch (a lone
    request's chunk blocks are items too); a block of more than 16 queries is a whole unit, an
    iteration of its own."""
    assert items_per_iteration(1) == DECODE_ITEMS_PER_ITERATION == 16
    assert [items_per_iteration(q) for q in (2, 8, 16, 32, 128)] == [16, 16, 16, 1, 1]
    assert [whole_units(q) for q in (1, 2, 8, 16, 17, 32, 128)] == [False] * 4 + [True] * 3


def test_loop_widths_and_span_columns():
    assert loop_widths(4) == [4, 2, 1] and loop_widths(1) == [1]
    for bad in (0, 3, 6):
        with pytest.raises(AssertionError, match=f"per_iteration={bad}"):
            loop_widths(bad)
    cols = [span_column(k, w, 4) for k in range(len(ITEM_CLASSES)) for w in (4, 2, 1)]
    assert cols == list(range(0, 2 * len(cols), 2))              # [first, end) pairs, no overlap
    # then START, BSLOT, BOUT
    assert span_cols(4) == 2 * len(cols) + 3 and span_cols(1) == 2 * len(ITEM_CLASSES) + 3
    assert span_start(4) == 2 * len(cols)


def test_class_items_split_a_range_into_masked_chunks_and_blocks():
    kinds = {k: c for k, c in enumerate(ITEM_CLASSES)}
    for full_lo, full_hi, a, e in [(1, 70, 0, 71), (0, 0, 0, 0), (3, 3, 0, 6), (0, 31, 0, 31),
                                   (2, 100, 5, 90), (0, 64, 0, 64), (5, 6, 0, 9)]:
        items = class_items(full_lo, full_hi, a, e)
        covered = sorted(c for _, lo, hi in items for c in range(lo, hi))
        assert covered == list(range(a, e))                       # every chunk exactly once
        sizes = []
        for kind, lo, hi in items:
            size, masked = kinds[kind]
            assert hi - lo == size
            inside = full_lo <= lo and hi <= full_hi
            assert masked == (not inside)
            if not masked:
                sizes.append(size)
        small = [x for x in sizes if x < CHUNK_BLOCKS[0]]
        assert len(small) == len(set(small))                     # one block of each smaller size
        free = max(0, min(e, full_hi) - max(a, full_lo))
        assert sizes.count(CHUNK_BLOCKS[0]) == free // CHUNK_BLOCKS[0]
        assert _part_items(full_lo, full_hi, a, e) == len(items)   # the count the cut uses
    assert ITEM_CLASSES[0] == (0, False) and ITEM_CLASSES[1] == (1, True)
    assert list(CHUNK_BLOCKS) == sorted(CHUNK_BLOCKS, reverse=True) and CHUNK_BLOCKS[-1] == 1


@pytest.mark.parametrize("seed", range(4))
def test_tails_end_each_range_and_leave_whole_blocks(seed):
    """With tails: every chunk of [a, e) once; the chunks before the mask-free range are single
    masked chunks (the first of kind 1 only without a tail), the mask-free blocks are whole
    multiples of TAIL_CHUNKS from its start, and one tail of at most TAIL_CHUNKS chunks holds
    the rest (single masked chunks past it); the counts the cut uses agree."""
    rng = np.random.default_rng(seed)
    for _ in range(300):
        a = int(rng.integers(0, 6))
        e = a + int(rng.integers(0, 40))
        full_lo = int(rng.integers(a, e + 2))
        full_hi = int(rng.integers(full_lo, e + 2))
        items = class_items(full_lo, full_hi, a, e, tails=True)
        assert sorted(c for _, lo, hi in items for c in range(lo, hi)) == list(range(a, e))
        tails = [(lo, hi) for k, lo, hi in items if k == TAIL]
        lo_free = min(max(a, full_lo), e)
        blocks = [(lo, hi) for k, lo, hi in items if not ITEM_CLASSES[k][1] and k]
        for lo, hi in blocks:
            assert (hi - lo) % TAIL_CHUNKS == 0 and full_lo <= lo and hi <= full_hi
        assert sum(hi - lo for lo, hi in blocks) == max(0, min(e, full_hi) - lo_free) // (
            TAIL_CHUNKS) * TAIL_CHUNKS
        assert len(tails) <= 1 and all(0 < hi - lo <= TAIL_CHUNKS for lo, hi in tails)
        singles = [(k, lo) for k, lo, hi in items if ITEM_CLASSES[k] == (1, True)]
        for k, lo in singles:
            assert lo < lo_free or (tails and lo >= tails[0][1])
            assert k == MASKED_AGAIN or (not tails and lo == a)
        counts = np.bincount([k for k, _, _ in items], minlength=len(ITEM_CLASSES))
        np.testing.assert_array_equal(
            _kind_counts(full_lo, full_hi, np.array(a), np.array(e), tails=True), counts)


def test_causal_pairs_counts_each_query_key_pair():
    ql, kv = np.array([1, 5, 0, 300]), np.array([10, 5, 7, 1000])
    want = sum(_visible(int(k), int(q), i, -1, True)[1] for q, k in zip(ql, kv) for i in range(q))
    assert causal_pairs(ql, kv) == want


def _check_work(req, work, rows_bucket, U, P, cores):
    """Every unit's chunks [c0, c1) run exactly once over the cores, each item a row of
    req.items over its range with the kind's size (a tail: up to its size, its LEN clipped to
    its chunks); chains: a unit's first item on a core loads the identity, later ones the slot
    it stored, its last one there stores nothing (the slot past the scratch); the split unit's
    parts in slots rows + p."""
    kinds = dict(enumerate(ITEM_CLASSES))
    ident, past = state_slots(rows_bucket) - 1, state_slots(rows_bucket)
    assert work.items.shape == (table_rows(rows_bucket, int((req.c1 - req.c0).sum()) + 1),
                                META_COLS)
    assert work.spans.shape == (cores, span_cols(U))
    seen, used = {}, set()
    split_slots = {}
    for p in range(cores):
        span = work.spans[p]
        stored = set()
        for kind in range(len(ITEM_CLASSES)):
            for w in loop_widths(U):
                col = span_column(kind, w, U)
                assert (span[col + 1] - span[col]) % w == 0
        order = core_rows(span, U)
        # each loop iteration's first row names the next one's (the kernel loads its rows
        # ahead), the span row the first; the last names row 0; other rows name none
        firsts = [r for k in range(len(ITEM_CLASSES)) for w in loop_widths(U)
                  for r in range(span[span_column(k, w, U)], span[span_column(k, w, U) + 1], w)]
        assert span[span_start(U)] == (firsts[0] if firsts else 0)
        assert [work.items[r][NEXT] for r in firsts] == firsts[1:] + [0] * bool(firsts)
        assert not work.items[sorted(set(order) - set(firsts)), NEXT].any()
        ended = set()
        assert order == sorted(order) and not used & set(order)
        used |= set(order)
        for i in order:
            row = work.items[i]
            unit = int(row[OUT]) // max(1, int(req.out[1] - req.out[0]) if req.L.size > 1 else 1)
            unit = int(np.flatnonzero(req.out == row[OUT])[0])
            kind = next(k for k in range(len(ITEM_CLASSES)) if i in core_rows(
                _only(span, k, U), U))
            size, masked = kinds[kind]
            a, e = int(row[C0]), int(row[C1])
            want = req.items(np.array([unit]), np.array([a]), np.array([e]), P)[0]
            if kind == TAIL:
                assert 0 < e - a <= size
                want[LEN] = min(want[LEN], e * chunk_tokens(P))
                masked = not (req.full_lo[unit] <= a and e <= req.full_hi[unit])
            else:
                assert e - a == size
            np.testing.assert_array_equal(np.delete(row, [LOAD, STORE, NEXT]),
                                          np.delete(want, [LOAD, STORE, NEXT]))
            if size:
                inside = req.full_lo[unit] <= a and e <= req.full_hi[unit]
                assert masked == (not inside)
            slot = int(row[STORE])
            assert unit not in ended                 # nothing after a unit's last item
            if slot == past:                         # its last item here keeps no state
                ended.add(unit)
                slot = unit
            assert slot == unit or slot == rows_bucket + p
            if slot != unit:
                split_slots[p] = slot
            assert row[LOAD] == (slot if slot in stored else ident)
            if starts_fresh(kind):             # the kernel starts it from the identity
                assert row[LOAD] == ident
            stored.add(slot)
            seen.setdefault(unit, []).extend(range(a, e))
            if size == 0:
                assert req.c0[unit] == req.c1[unit]
    assert not work.items[sorted(set(range(len(work.items))) - used)].any()
    for b in range(req.L.size):
        assert sorted(seen.get(b, [])) == list(range(int(req.c0[b]), int(req.c1[b]))), b
        if req.c0[b] == req.c1[b] and not (cores == 2 and b == _split_unit(work, req)):
            assert b in seen                                      # an empty item writes it
    if cores == 2:
        for p in range(2):
            assert work.spans[p][-2] == split_slots.get(p, ident)
            assert work.spans[p][-1] == req.out[_split_unit(work, req)]


def _only(span, kind, U):
    """A span row keeping one kind's loops."""
    out = np.zeros_like(span)
    for w in loop_widths(U):
        col = span_column(kind, w, U)
        out[col:col + 2] = span[col:col + 2]
    return out


def _split_unit(work, req):
    return int(np.flatnonzero(req.out == work.spans[0][-1])[0])


@pytest.mark.parametrize("tails", [False, True])
@pytest.mark.parametrize("U", [1, 2, 4])
@pytest.mark.parametrize("seed", range(12))
def test_work_runs_every_chunk_once_and_two_cores_balance(seed, U, tails):
    rng = np.random.default_rng(seed)
    P = int(rng.choice([1, 16, 128, 256]))
    indptr, kv, ql = _random_batch(rng, P)
    kv[rng.random(kv.size) < 0.2] *= 20               # some requests long enough for 32-blocks
    indptr = np.concatenate([[0], np.cumsum(-(-kv // P) + 1)])
    qb = int(rng.choice([1, 8]))
    req = query_blocks(indptr, kv, np.minimum(ql, kv), qb, int(rng.choice([-1, 50])), True, P)
    rows = req.L.size + int(rng.integers(0, 3))
    one = split_work(req, P, rows, 1, U, tails=tails)
    two = split_work(req, P, rows, 2, U, tails=tails)
    _check_work(req, one, rows, U, P, 1)
    _check_work(req, two, rows, U, P, 2)
    # loads: the split unit pays its items on both cores; the halves within one item's work
    assert abs(two.loads[0] - two.loads[1]) <= 1 + 2 * (CUT_ITEM_COST_CHUNKS
                                                       + CUT_ITERATION_COST_CHUNKS)


def test_one_core_load_is_chunks_and_items():
    indptr, kv = np.array([0, 64, 64]), np.array([1024, 0])
    work = decode_work(indptr, kv, -1, 16, 4)               # one core unless asked for two
    per_item = ITEM_COST_CHUNKS + ITERATION_COST_CHUNKS       # an item alone in its loop
    # 8 mask-free chunks: one block of 8; the empty request: one empty item
    assert work.loads == (pytest.approx(8 + 2 * per_item),)
    assert work.items.dtype == work.spans.dtype == np.int32
    # two requests of one block of 8 each: two items of one kind share one iteration
    two = decode_work(np.array([0, 64, 128]), np.array([1024, 1024]), -1, 16, 2)
    assert two.loads == (pytest.approx(16 + 2 * ITEM_COST_CHUNKS + ITERATION_COST_CHUNKS),)
    order = core_rows(work.spans[0], U)
    assert [tuple(work.items[i][[OUT, C0, C1]]) for i in order] == [(1, 0, 0), (0, 0, 8)]
    # 1100 keys, a window of 301 from key 799 (inside chunk 6 of 0..8): masked chunks 6 and 8,
    # mask-free chunk 7 (a block of 1): 3 items, chained
    work = decode_work(np.array([0, 69]), np.array([1100]), 300, 16, 1)
    # the first masked chunk, the unit's second one (MASKED_AGAIN: it merges, so it never
    # shares an iteration with the first) and the block of 1 each have their own loop
    assert work.loads == (pytest.approx(3 + 3 * ITEM_COST_CHUNKS + 3 * ITERATION_COST_CHUNKS),)
    order = core_rows(work.spans[0], U)
    assert [tuple(work.items[i][[C0, C1, LOAD, STORE]]) for i in order] == [
        (6, 7, state_slots(1) - 1, 0), (8, 9, 0, 0), (7, 8, 0, state_slots(1))]
    kinds = [next(k for k in range(len(ITEM_CLASSES)) if i in core_rows(
        _only(work.spans[0], k, U), U)) for i in order]
    assert kinds == [1, MASKED_AGAIN, len(ITEM_CLASSES) - 1]
    req = query_blocks(np.array([0, 69]), np.array([1100]), np.array([1]), 1, 300, True, 16)
    assert split_work(req, 16, 1, per_iteration=U).loads == work.loads
    assert split_work(req, 16, 1).loads == (
        pytest.approx(3 + 3 * (ITEM_COST_CHUNKS + ITERATION_COST_CHUNKS)),)


def _brute_force_best_load(lens, window_left=-1):
    """The slower core's modelled load under the best cut, listing every cut's items: requests
    of ``lens`` tokens (> 0, chunks of 128 tokens) attending to keys [n - 1 - window_left, n)
    (all when window_left < 0): chunks wholly inside are mask-free, the others masked. The
    requests in their order, and (three or more) grouped by the kinds of item they have."""
    chunks = []                                       # (first, end, first full, full end)
    for n in map(int, lens):
        start = max(0, n - 1 - window_left) if window_left >= 0 else 0
        chunks.append((start // 128, -(-n // 128), -(-start // 128), n // 128))

    def load(items):
        by_kind = [sum(1 for k, _, _ in items if k == kind) for kind in range(len(ITEM_CLASSES))]
        iters = sum(n // U + bin(n % U).count("1") for n in by_kind)
        return (sum(e - a for _, a, e in items) + len(items) * CUT_ITEM_COST_CHUNKS
                + iters * CUT_ITERATION_COST_CHUNKS)

    def best_in(order):
        def items(b, a, e):
            return class_items(order[b][2], order[b][3], a, e)
        best = None
        for k, (c0, c1, _, _) in enumerate(order):
            left = [it for b in range(k) for it in items(b, *order[b][:2])]
            right = [it for b in range(k + 1, len(order)) for it in items(b, *order[b][:2])]
            for c in range(c0, c1 + 1):
                sides = (load(left + items(k, c0, c)), load(right + items(k, c, c1)))
                best = max(sides) if best is None else min(best, max(sides))
        return best
    best = best_in(chunks)
    if len(chunks) > 2:                    # grouped: by which kinds each request has
        has = [tuple(any(k == kind for k, _, _ in class_items(lo, hi, a, e))
                     for kind in range(len(ITEM_CLASSES))) for a, e, lo, hi in chunks]
        best = min(best, best_in([chunks[b] for b in sorted(range(len(chunks)),
                                                            key=lambda b: has[b])]))
    return best


@pytest.mark.parametrize("window_left", [-1, 700, 1000])
@pytest.mark.parametrize("lens", [[2000, 100, 100], [4000, 2900, 2900], [5000, 10, 10, 10],
                                  [300, 9, 1200, 64, 5], [128 * 33 + 7, 128 * 3], [32768]])
def test_the_cut_is_the_best_of_every_cut(lens, window_left):
    """The two cores' loads: the slower one is the least any cut gives (every cut listed, its
    items made by class_items and their loop iterations counted per kind), every item holds
    chunks, and each chunk runs once."""
    lens = np.array(lens)
    indptr = np.concatenate([[0], np.cumsum(-(-lens // 16))])
    work = decode_work(indptr, lens, window_left, 16, len(lens), 2)
    assert max(work.loads) == pytest.approx(_brute_force_best_load(lens, window_left))
    ranges = [(int(work.items[i][OUT]), int(work.items[i][C0]), int(work.items[i][C1]))
              for p in (0, 1) for i in core_rows(work.spans[p], U)]
    assert all(a < e for _, a, e in ranges)
    for b, n in enumerate(lens):
        chunks = sorted(c for o, a, e in ranges if o == b for c in range(a, e))
        first = max(0, int(n) - 1 - window_left) // 128 if window_left >= 0 else 0
        assert chunks == list(range(first, -(-int(n) // 128)))


def test_a_cut_at_a_request_boundary_never_makes_a_negative_half():
    """[A, B, B] tokens over a grid: wherever the best cut falls, every item of both cores holds
    at least one chunk (a cut at a request's first or last chunk gives one core none of it:
    that core's boundary slot is the identity)."""
    at_boundary = 0
    for A in range(2000, 6000, 61):
        for B in range(100, 3000, 89):
            lens = np.array([A, B, B])
            indptr = np.concatenate([[0], np.cumsum(-(-lens // 16))])
            work = decode_work(indptr, lens, -1, 16, 4, 2)
            ranges = [(int(work.items[i][C0]), int(work.items[i][C1]))
                      for p in (0, 1) for i in core_rows(work.spans[p], U)]
            assert all(a < e for a, e in ranges), (A, B)
            at_boundary += int(state_slots(4) - 1 in work.spans[:, -2])
    assert at_boundary > 0                       # the grid reaches the case


def test_table_rows_are_a_shape_of_the_bucket_and_capacity():
    lens = np.array([2000, 1054, 1054])
    req = query_blocks(np.concatenate([[0], np.cumsum(-(-lens // 16))]), lens,
                       np.ones(3, np.int64), 1, -1, True, 16)
    assert split_work(req, 16, 4, capacity=1000).items.shape == (table_rows(4, 1000), META_COLS)
    assert split_work(req, 16, 4, 2, 4, capacity=1000).items.shape == (table_rows(4, 1000),
                                                                       META_COLS)
    assert capacity_chunks(100, 16) == 100 * 16 // 128 + 1
    assert capacity_chunks(10, 256) == 10 * 2 + 1


def test_two_cores_over_an_empty_batch_run_nothing():
    work = decode_work(np.zeros(1, np.int32), np.zeros(0), -1, 16, 1, 2)
    assert work.spans.dtype == work.items.dtype == np.int32
    ident = state_slots(1) - 1
    assert work.spans[:, :-2].sum() == 0 and work.spans[:, -2].tolist() == [ident, ident]
    assert not work.items.any() and work.loads == (0.0, 0.0)


def test_one_long_request_is_cut_into_equal_loads():
    work = decode_work(np.array([0, 2048]), np.array([32768]), -1, 16, 1, 2)
    assert work.loads[0] == pytest.approx(work.loads[1])
    per_core = [sorted(c for i in core_rows(work.spans[p], U)
                       for c in range(work.items[i][C0], work.items[i][C1])) for p in (0, 1)]
    assert per_core == [list(range(0, 128)), list(range(128, 256))]
    assert work.spans[:, -2].tolist() == [1, 2] and work.spans[:, -1].tolist() == [0, 0]


def test_an_empty_request_at_the_cut_has_no_items_on_either_core():
    """[100, 0, 100] tokens: the cut falls in the empty middle request; neither core has an item
    of it, both merge the identity and program 0 writes its empty result."""
    indptr, kv = np.array([0, 7, 7, 14]), np.array([100, 0, 100])
    work = decode_work(indptr, kv, -1, 16, 4, 2)
    ident = state_slots(4) - 1
    assert work.spans[:, -2].tolist() == [ident, ident] and work.spans[:, -1].tolist() == [1, 1]
    outs = [int(work.items[i][OUT]) for p in (0, 1) for i in core_rows(work.spans[p], U)]
    assert sorted(outs) == [0, 2]
    assert work.loads[0] == pytest.approx(work.loads[1])


def test_cores_must_be_one_or_two():
    with pytest.raises(ValueError, match="cores=3"):
        decode_work(np.array([0, 1]), np.array([5]), -1, 16, 1, 3)


def _check_whole_units(req, work, rows_bucket, P, cores):
    """Whole units (prefill blocks): a core's units run as one item each over all their chunks
    [c0, c1), in unit order; with two cores and one unit, each core has one more item, its part
    of the split unit (the parts [c0, cut) and [cut, c1) on cores 0 and 1); with two units or
    more, no unit is split (span column 3 is 0) and each core has units of its own; every
    chunk runs exactly once and the rows no core runs are zero."""
    assert work.spans.shape == (cores, WHOLE_UNIT_SPAN_COLS)
    seen, used, parts = {}, [], []
    for p in range(cores):
        first, end = (int(x) for x in work.spans[p, :2])
        used.extend(range(first, end))
        units = [int(np.flatnonzero(req.out == work.items[i][OUT])[0]) for i in range(first, end)]
        assert units == sorted(units)
        for i, b in zip(range(first, end), units):
            want = req.items(np.array([b]), req.c0[b:b + 1], req.c1[b:b + 1], P)[0]
            np.testing.assert_array_equal(work.items[i], want)
            seen.setdefault(b, []).extend(range(int(req.c0[b]), int(req.c1[b])))
        if cores == 2:
            split = int(work.spans[p, 3])
            assert split == (1 if req.L.size == 1 else 0)
            if split:
                i = int(work.spans[p, 2])
                used.append(i)
                parts.append(work.items[i])
    if cores == 2 and req.L.size > 1:      # each core has units of its own, in disjoint rows
        assert all(int(work.spans[p, 1]) > int(work.spans[p, 0]) for p in range(2))
        assert int(work.spans[0, 1]) <= int(work.spans[1, 0])
    if cores == 2 and req.L.size == 1:
        b = 0
        assert parts[0][OUT] == parts[1][OUT] == req.out[b]
        (a0, e0), (a1, e1) = [(int(r[C0]), int(r[C1])) for r in parts]
        if a0 < e0 and a1 < e1:
            assert (a0, e1, e0) == (req.c0[b], req.c1[b], a1)
        for a, e, row in ((a0, e0, parts[0]), (a1, e1, parts[1])):
            if a < e:
                np.testing.assert_array_equal(row, req.items(np.array([b]), np.array([a]),
                                                             np.array([e]), P)[0])
            seen.setdefault(b, []).extend(range(a, e))
    assert len(used) == len(set(used))
    assert not work.items[sorted(set(range(len(work.items))) - set(used))].any()
    for b in range(req.L.size):
        assert sorted(seen.get(b, [])) == list(range(int(req.c0[b]), int(req.c1[b]))), b


@pytest.mark.parametrize("seed", range(12))
def test_whole_units_run_every_chunk_once_on_one_or_two_cores(seed, monkeypatch):
    rng = np.random.default_rng(seed)
    P = int(rng.choice([1, 16, 128, 256]))
    _, kv, ql = _random_batch(rng, P)
    kv[rng.random(kv.size) < 0.3] *= 12
    indptr = np.concatenate([[0], np.cumsum(-(-kv // P) + 1)])
    qb = int(rng.choice([32, 64, 128]))
    assert whole_units(qb)
    req = query_blocks(indptr, kv, np.minimum(ql, kv), qb, int(rng.choice([-1, 50])), True, P)
    rows = req.L.size + int(rng.integers(0, 3))
    _check_whole_units(req, split_work(req, P, rows, 1, 1, whole=True), rows, P, 1)
    two = split_work(req, P, rows, 2, 1, whole=True)
    _check_whole_units(req, two, rows, P, 2)
    if req.L.size > 1:           # the edge with the least work on the slower core: within a
        # unit's chunks of the flat list's cut (its items priced as whole units' are)
        monkeypatch.setattr(work_module, "CUT_ITEM_COST_CHUNKS", ITEM_COST_CHUNKS)
        monkeypatch.setattr(work_module, "CUT_ITERATION_COST_CHUNKS", ITERATION_COST_CHUNKS)
        assert max(two.loads) <= max(split_work(req, P, rows, 2, 1).loads) + 2 * max(
            int((req.c1 - req.c0).max()), 1) + 20


def test_whole_units_of_an_empty_batch_on_two_cores_run_an_empty_item_each():
    req = query_blocks(np.zeros(1, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64), 32,
                       -1, True, 16)
    work = split_work(req, 16, 1, 2, 1, whole=True)
    assert work.spans.tolist() == [[0, 0, 0, 0], [1, 1, 1, 0]] and not work.items.any()


def test_two_units_on_two_cores_run_one_each_and_none_is_split():
    """Two equal units: one per core, no split part (span column 3 is 0); one unit: split in
    two parts of its chunks, one per core, neither empty."""
    kv = np.array([1024, 1024])
    req = query_blocks(np.array([0, 64, 128]), kv, np.array([128, 128]), 128, -1, True, 16)
    work = split_work(req, 16, 2, 2, 1, whole=True)
    assert work.spans[:, 3].tolist() == [0, 0]
    assert [int(work.spans[p, 1] - work.spans[p, 0]) for p in (0, 1)] == [1, 1]
    _check_whole_units(req, work, 2, 16, 2)
    one = query_blocks(np.array([0, 64]), kv[:1], np.array([128]), 128, -1, True, 16)
    work = split_work(one, 16, 1, 2, 1, whole=True)
    assert work.spans[:, 3].tolist() == [1, 1]
    parts = [work.items[work.spans[p, 2]] for p in (0, 1)]
    sizes = [int(r[C1] - r[C0]) for r in parts]
    assert sum(sizes) == 8 and min(sizes) > 0
    _check_whole_units(one, work, 1, 16, 2)


def test_loop_iterations_over_a_cores_whole_units():
    """Groups of four, then at most one group of two and one unit alone."""
    got = work_module.group_iterations(np.array([0, 1, 4, 5, 6, 7, 8, 11]), 4)
    assert got.tolist() == [0, 1, 1, 2, 2, 3, 2, 4]
    assert work_module.group_iterations(np.array([3]), 1).tolist() == [3]


def test_two_cores_share_whole_units_by_their_work_not_their_order():
    """Four prompt chunks of 11 / 9 / 7 / 5 chunks of keys: the cut in their order leaves the
    slower core 20 of 32 chunks; any two-and-two sharing takes 16 each."""
    chunks = np.array([11, 9, 7, 5])
    ones, loads = work_module._whole_halves(chunks, np.zeros((4, 3), np.int64), 1, False)
    assert (ones @ chunks, (1 - ones) @ chunks) == (16, 16) and ones[0] == 0
    assert loads[0] == loads[1]


def test_two_cores_weigh_their_loops_over_whole_units(monkeypatch):
    """Twelve units of 64 queries (16 tiles each), every sharing weighed: 7 / 5 balances their
    chunks to one, but 7 units take three loop iterations in groups of four (4 + 2 + 1); with
    the iterations priced, no core takes more than two."""
    monkeypatch.setattr(work_module, "WHOLE_HALVES_SEARCH_UNITS", 12)
    chunks = np.array([10, 11, 8, 9, 7, 7, 4, 5, 5, 5, 2, 2])
    kinds = np.zeros((12, 3), np.int64)
    plain, _ = work_module._whole_halves(chunks, kinds, 1, False)
    assert max(work_module.group_iterations(np.array([plain.sum(), 12 - plain.sum()]), 4)) == 3
    priced, _ = work_module._whole_halves(chunks, kinds, 1, False, 4, 16)
    units = np.array([priced.sum(), 12 - priced.sum()])
    assert max(work_module.group_iterations(units, 4)) == 2
    assert abs(int(priced @ chunks) - int((1 - priced) @ chunks)) <= 12


def test_many_whole_units_take_the_better_of_a_cut_and_a_greedy_sharing():
    """Past WHOLE_HALVES_SEARCH_UNITS the cores weigh the cuts in the units' order and a greedy
    sharing by chunks (largest first, each to the lighter core): growing lengths balance by the
    greedy one (no cut does), one long unit first by the cut after it."""
    B = work_module.WHOLE_HALVES_SEARCH_UNITS + 2
    kinds = np.zeros((B, 3), np.int64)
    chunks = np.arange(B) + 1
    ones, _ = work_module._whole_halves(chunks, kinds, 1, False)
    assert (ones == work_module._greedy_halves(chunks)).all()
    assert abs(int(ones @ chunks) - int((1 - ones) @ chunks)) <= 1
    chunks = np.array([100] + [1] * (B - 1))
    ones, _ = work_module._whole_halves(chunks, kinds, 1, False)
    assert ones[0] != ones[1] and (ones[1:] == ones[1]).all()
    assert sorted(work_module._greedy_halves(np.array([5, 9, 7, 3])).tolist()) == [0, 0, 1, 1]
