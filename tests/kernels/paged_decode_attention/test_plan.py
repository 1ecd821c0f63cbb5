"""The host plan (plan.py) against its meaning, without the simulator: decode every work-item row
back into the keys each query row may see and compare with FlashInfer's rules computed here one
query at a time; check the chunk ranges the kernel loops over (masked / mask-free), the page
addressing columns, the LNC=2 cut and the loop-iteration count. Fast: these run under mutation
testing of plan.py (docs/contributing.md)."""

import numpy as np
import pytest

from nki_kernels.access_patterns import PagedKVLayout
from nki_kernels.paged_decode_attention.plan import (
    BOUNDARY, C0, C1, CHUNK_BLOCKS, END, ENTRY0, FIRST, FULL_HI, FULL_LO, HI_BASE,
    DECODE_ITEMS_PER_ITERATION, ITEM_COST_CHUNKS, ITERATION_COST_CHUNKS, LEN, META_COLS, NO_WINDOW, OUT, POS0, PTR, Q_BASE,
    SLOT0, W_SPAN, WIN, causal_pairs, chunk_tokens, decode_work, items_per_iteration,
    loop_iterations, make_layout,
    query_blocks, request_table, split_work)


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
    layout = make_layout(PagedKVLayout(10, page_size, 2, 8, "NHD", True))
    tab = layout.token_table(page_size)
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
    """Row p * rows_per_page + e * entry_stride (+ v_rows for V) is where the layout puts token e
    of page p, head 0, in rows of D elements."""
    geo = PagedKVLayout(7, 5, 3, 8, layout, fused)
    dec = make_layout(geo)
    assert dec.strides == (dec.rows_per_page, dec.entry_stride, dec.v_rows)
    assert all(type(x) is int for x in dec.strides)       # static kernel arguments: exact ints
    for p in range(7):
        for e in range(5):
            for kv in (0, 1) if fused else (0,):
                row = p * dec.rows_per_page + e * dec.entry_stride + kv * dec.v_rows
                assert row * geo.head_dim == geo.start(p, e, kv)


def test_items_per_iteration_by_bucket():
    """Four decode items share a loop iteration, never more than the bucket holds; a block of
    query tokens (prefill) takes an iteration of its own."""
    assert [items_per_iteration(1, b) for b in (0, 1, 2, 3, 4, 8, 256)] == [1, 1, 2, 3, 4, 4, 4]
    assert [items_per_iteration(q, 64) for q in (2, 8, 128)] == [1, 1, 1]


def test_loop_iterations_take_the_largest_blocks_first():
    def greedy(n):
        count = 0
        for size in CHUNK_BLOCKS:
            count += n // size
            n %= size
        return count
    full = np.arange(0, 200)
    np.testing.assert_array_equal(loop_iterations(full, np.zeros_like(full)),
                                  [greedy(int(n)) for n in full])
    np.testing.assert_array_equal(loop_iterations(np.array([33, 0]), np.array([2, 1])), [4, 1])
    assert CHUNK_BLOCKS[-1] == 1 and list(CHUNK_BLOCKS) == sorted(CHUNK_BLOCKS, reverse=True)


def test_causal_pairs_counts_each_query_key_pair():
    ql, kv = np.array([1, 5, 0, 300]), np.array([10, 5, 7, 1000])
    want = sum(_visible(int(k), int(q), i, -1, True)[1] for q, k in zip(ql, kv) for i in range(q))
    assert causal_pairs(ql, kv) == want


def _items_of_core(work, core):
    span = work.spans[core]
    return list(range(span[FIRST], span[END])), int(span[BOUNDARY])


def _check_region(items, full, U):
    """A core's rows: the empty items padding ``full`` (its whole items) to a multiple of U,
    each taking the first item's output row, then ``full`` in order."""
    assert len(items) % U == 0 and len(items) - len(full) == (-len(full)) % U
    pad = len(items) - len(full)
    np.testing.assert_array_equal(items[pad:], full)
    if pad:
        assert (items[:pad, OUT] == full[0][OUT]).all()
        assert not np.delete(items[:pad], OUT, axis=1).any()


@pytest.mark.parametrize("U", [1, 4])
@pytest.mark.parametrize("seed", range(12))
def test_two_cores_cut_partitions_every_request_and_balances(seed, U):
    rng = np.random.default_rng(seed)
    P = int(rng.choice([1, 16, 128, 256]))
    indptr, kv, ql = _random_batch(rng, P)
    qb = int(rng.choice([1, 8]))
    req = query_blocks(indptr, kv, ql, qb, int(rng.choice([-1, 50])), True, P)
    rows = req.L.size + int(rng.integers(0, 3))
    one = split_work(req, P, rows, 1, U)
    two = split_work(req, P, rows, 2, U)
    n = req.L.size
    # one core: every item whole, in order, after the padding items
    full = req.items(np.arange(n), req.c0, req.c1, P)
    assert one.spans.shape == (1, 3) and one.spans[0][FIRST] == 0 and one.spans[0][BOUNDARY] == 0
    _check_region(one.items[:one.spans[0][END]], full, U)
    assert not one.items[one.spans[0][END]:].any()
    assert one.items.shape == (rows + U - 1, META_COLS)
    # two cores: items 0 and 1 are the split request's halves, the rest whole; each core's whole
    # items are consecutive (padded as above), core 0 before core 1
    assert two.items.shape == (rows + 2 + 2 * (U - 1), META_COLS)
    (w0, b0), (w1, b1) = _items_of_core(two, 0), _items_of_core(two, 1)
    assert (b0, b1) == (0, 1) and two.spans[0][FIRST] == 2
    assert two.spans[1][FIRST] == two.spans[0][END]
    # the split request: the first whose rows are not among core 0's whole items
    k = next(b for b in range(n + 1) if b == n or not any(
        np.array_equal(two.items[i], full[b]) for i in w0))
    _check_region(two.items[w0[0]:w0[-1] + 1] if w0 else two.items[2:2], full[:k], U)
    _check_region(two.items[w1[0]:w1[-1] + 1] if w1 else two.items[2:2], full[k + 1:], U)
    halves = two.items[0:2]
    np.testing.assert_array_equal(np.delete(halves[0], [C0, FULL_LO, FULL_HI, C1, SLOT0, ENTRY0,
                                                        POS0]),
                                  np.delete(full[k], [C0, FULL_LO, FULL_HI, C1, SLOT0, ENTRY0,
                                                      POS0]))
    assert halves[0][C0] == full[k][C0] and halves[0][C1] == halves[1][C0]
    assert halves[1][C1] == full[k][C1]
    for h in halves:                              # each half's mask-free range is its own
        assert h[C0] <= h[FULL_LO] <= h[FULL_HI] <= h[C1]
        want_lo = np.clip(full[k][FULL_LO], h[C0], h[C1])
        assert h[FULL_LO] == want_lo and h[FULL_HI] == np.clip(full[k][FULL_HI], want_lo, h[C1])
        T = chunk_tokens(P)
        assert h[POS0] == h[C0] * T and h[SLOT0] == h[PTR] + h[C0] * T // P
    # loads: the one-core total plus one more item's fixed cost, cut within a chunk's work plus
    # one loop iteration and one item
    assert np.isclose(sum(two.loads), one.loads[0] + ITEM_COST_CHUNKS)
    assert abs(two.loads[0] - two.loads[1]) <= 1 + ITERATION_COST_CHUNKS + ITEM_COST_CHUNKS


def test_one_core_load_is_chunks_iterations_and_items():
    indptr, kv = np.array([0, 64, 64]), np.array([1024, 0])
    work = decode_work(indptr, kv, -1, 16, 4)               # one core unless asked for two
    # 8 mask-free chunks: one iteration of a block of 8; the empty request costs its item only
    assert work.loads == (pytest.approx(8 + ITERATION_COST_CHUNKS + 2 * ITEM_COST_CHUNKS),)
    # in a bucket of 4, 4 items share a loop iteration: two requests led by two empty items
    # writing request 0's row
    assert DECODE_ITEMS_PER_ITERATION == 4
    assert work.items.dtype == work.spans.dtype == np.int32 and work.spans.tolist() == [[0, 4, 0]]
    assert work.items.shape == (4 + DECODE_ITEMS_PER_ITERATION - 1, META_COLS)
    assert work.items[:2, OUT].tolist() == [0, 0] and not work.items[:2, LEN:].any()
    assert work.items[2:4, OUT].tolist() == [0, 1] and work.items[2, LEN] == 1024
    # 1100 keys, a window of 301 from key 799 (inside chunk 6 of 0..8): masked chunks 6 and 8,
    # mask-free chunk 7 (a block of 1): 3 chunks, 3 iterations
    work = decode_work(np.array([0, 69]), np.array([1100]), 300, 16, 1)
    assert work.loads == (pytest.approx(3 + 3 * ITERATION_COST_CHUNKS + ITEM_COST_CHUNKS),)
    req = query_blocks(np.array([0, 69]), np.array([1100]), np.array([1]), 1, 300, True, 16)
    assert split_work(req, 16, 1).loads == work.loads


def test_a_cut_just_before_a_request_never_makes_a_negative_half():
    """[A, B, B] tokens over a grid: where core 0's whole request stops just short of half the
    work, the balanced share of the next request is below zero: core 0 then takes none of it
    (an empty first half), never a negative chunk count."""
    empty_first = 0
    for A in range(2000, 6000, 61):
        for B in range(100, 3000, 89):
            lens = np.array([A, B, B])
            indptr = np.concatenate([[0], np.cumsum(-(-lens // 16))])
            halves = decode_work(indptr, lens, -1, 16, 4, 2).items[0:2]
            assert halves[0][C0] <= halves[0][C1] == halves[1][C0] <= halves[1][C1], (A, B)
            empty_first += int(halves[0][C0] == halves[0][C1] and halves[1][C1] > 0)
    assert empty_first > 0                       # the grid reaches the case


def test_split_work_takes_one_item_per_iteration_unless_told():
    lens = np.array([2000, 1054, 1054])
    req = query_blocks(np.concatenate([[0], np.cumsum(-(-lens // 16))]), lens,
                       np.ones(3, np.int64), 1, -1, True, 16)
    assert split_work(req, 16, 4).items.shape == (4, META_COLS)
    assert split_work(req, 16, 4, 1, 4).items.shape == (7, META_COLS)


def test_two_cores_over_an_empty_batch_run_only_the_padding_row():
    work = decode_work(np.zeros(1, np.int32), np.zeros(0), -1, 16, 1, 2)
    assert work.spans.dtype == work.items.dtype == np.int32
    assert work.spans.tolist() == [[2, 2, 0], [2, 2, 1]]
    assert work.items.shape == (1 + 2, META_COLS) and not work.items.any()   # a bucket of 1


def test_one_long_request_is_cut_into_equal_loads():
    work = decode_work(np.array([0, 2048]), np.array([32768]), -1, 16, 1, 2)
    assert work.loads[0] == pytest.approx(work.loads[1])
    assert [(r[C0], r[C1]) for r in work.items[:2]] == [(0, 128), (128, 256)]


def test_an_empty_request_at_the_cut_is_split_into_two_empty_parts():
    """[100, 0, 100] tokens: the cut falls in the empty middle request; both its parts are
    empty and the loads add up."""
    indptr, kv = np.array([0, 7, 7, 14]), np.array([100, 0, 100])
    work = decode_work(indptr, kv, -1, 16, 3, 2)
    assert (work.items[0:2, OUT] == 1).all()
    assert (work.items[0:2, C0] == work.items[0:2, C1]).all() and not work.items[0:2, LEN].any()
    one = decode_work(indptr, kv, -1, 16, 3, 1)
    assert sum(work.loads) == pytest.approx(one.loads[0] + ITEM_COST_CHUNKS)
    assert work.loads[0] == pytest.approx(work.loads[1])


def test_cores_must_be_one_or_two():
    with pytest.raises(ValueError, match="cores=3"):
        decode_work(np.array([0, 1]), np.array([5]), -1, 16, 1, 3)
