"""The static pass: a small decode bucket runs without device loops (work.static_pass), each row
one masked item over a number of chunks from work.STATIC_CHUNK_COUNTS; the chunks past a
request's keys read nothing. Checked against the reference and against the looped plan of the same step."""

import numpy as np
import pytest

from nki_kernels import simulate
from nki_kernels.paged_attention import batch_decode, batch_decode_kernel, batch_decode_ref
from nki_kernels.paged_attention import work
from nki_kernels.paged_attention.work import query_blocks, static_pass, static_work, NullItems

from .conftest import assert_close, make_decode_case
from .test_serving_shape import FixedCache


def _req(lens, window_left=-1, P=16):
    lens = np.asarray(lens)
    indptr = np.concatenate([[0], np.cumsum(-(-lens // P))])
    return query_blocks(indptr, lens, np.ones_like(lens), 1, window_left, True, P)


def _moved(trace, tensor):
    return sum(e.dma_bytes for e in trace if e.engine == "dma"
               and any(o.tensor == tensor for o in e.operands))


def test_the_policy_takes_it_where_loops_cost_more():
    assert static_pass(_req([1000]), 16, 1) == 8               # 8 chunks: 4 kinds of items
    assert static_pass(_req([2000]), 16, 1) == 16
    assert static_pass(_req([1024] * 8), 16, 8) == 8           # 108.5 us against 120.2
    assert static_pass(_req([1300, 900] * 8), 16, 16) == 12    # 306 us against 408 looped
    # in sections (24 rows of 2 chunks, the 8 empty of 1): 81.6 us against 81.1 looped
    assert static_pass(_req([256] * 24), 16, 32) == 2
    assert static_pass(_req([256] * 8), 16, 8) == 2            # 8 x 2 chunks: 46 us against 50
    # 19 requests in 32 rows, four packed a tile (Llama-3-8B): 290.9 us against 357.7 looped
    # (weighed with packed requests sharing half a slot, whatever the split chosen)
    assert static_pass(_req([1072] * 19), 16, 32, pack=4) == 12
    # LNC=2: each core half the rows and no barrier, against two barriers on each core
    assert static_pass(_req([300] * 4), 16, 4, cores=2) == 3
    assert static_pass(_req([1024]), 16, 1) == 8               # one item, one loop: still static
    # one request on two cores: split, each core half its chunk slots
    assert static_pass(_req([512]), 16, 1, cores=2) == 2
    assert static_pass(_req([4096]), 16, 1, cores=2) == 16
    assert static_pass(_req([100, 700, 300, 50]), 16, 4) == 6   # a spread batch: 6 of 6 chunks
    assert static_pass(_req([1100]), 16, 1) == 12               # 9 chunks: padded to 12
    assert static_pass(_req([3000]), 16, 1, cores=2) == 12      # 24 chunks, 12 a core
    assert static_pass(_req([1000]), 16, 1, nc_version=2) == 0  # no indirect DMA on trn1
    assert static_pass(_req([1000]), 256, 1) == 0               # pages over 128 tokens
    assert static_pass(_req([5000]), 16, 1) == 0                # past STATIC_MAX_CHUNKS
    # a chunk's K and V past STATIC_MAX_CHUNK_BYTES (fp32, 16 kv heads of 128): loops
    assert static_pass(_req([1000]), 16, 1, chunk_bytes=16 * (128 + 128) * 4) == 0
    assert static_pass(_req([1000]), 16, 1, chunk_bytes=8 * (128 + 128) * 2) == 8


def test_chunk_counts_pad_a_row_by_at_most_a_third():
    for need in range(1, work.STATIC_MAX_CHUNKS + 1):
        count = work.static_chunk_count(need)
        assert count in work.STATIC_CHUNK_COUNTS and count >= need
        assert count <= max(4, need * 3 // 2)
    assert work.static_chunk_count(work.STATIC_MAX_CHUNKS + 1) > work.STATIC_MAX_CHUNKS


@pytest.mark.parametrize("lens, cores, count", [([300, 40, 129], 1, 3), ([700, 641, 17, 650], 1, 6),
                                                ([700, 641, 17, 650], 2, 6), ([1100], 1, 12),
                                                ([1500], 2, 6)])
def test_rows_of_three_six_and_twelve_chunks_match_the_reference(rng, lens, cores, count):
    """Rows padded to 3, 6 or 12 chunks (softmax steps of 3, 3 and 4 chunks), lengths that end
    inside a page, on a page boundary and past a chunk boundary; both cores."""
    from nki_kernels.paged_attention.kernel_items import static_step_chunks
    from nki_kernels.buckets import bucket
    assert [static_step_chunks(c, 4) for c in (3, 6, 12, 5)] == [3, 3, 4, 1]
    assert static_pass(_req(lens), 16, bucket(len(lens)), cores) == count
    cache = FixedCache(rng, pages=400)
    q, kv, *table = cache.step(lens)
    with simulate.use_target("trn2"):
        out = batch_decode(q, kv, *table, lnc=cores)
        assert not simulate.last_trace().loops
    np.testing.assert_allclose(out, batch_decode_ref(q, kv, *table), rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("rows, low, high", [
    (16, 100, 400), (32, 257, 384), (16, 641, 768),
    pytest.param(32, 300, 1024, marks=pytest.mark.slow),
    pytest.param(16, 600, 2048, marks=pytest.mark.slow),
    pytest.param(8, 1000, 4096, marks=pytest.mark.slow)])
def test_a_full_bucket_of_static_rows_fits_sbuf(rng, monkeypatch, rows, low, high):
    """Llama-3-8B's kv heads (8 x 128, fp32 here: the largest chunk a static pass takes,
    work.STATIC_MAX_CHUNK_BYTES): 16 rows of 4 chunks, whose first gathers (256 KiB a
    partition) had overflowed SBUF: a few rows' go first, the others' through the pipeline
    (kernel.STATIC_UPFRONT_BYTES); up to the most slots a static pass takes
    (work.STATIC_MAX_SLOTS: 32 rows of 8 chunks, 16 of 16, 8 of 32), taken whatever the policy
    would pick; matches the reference on both cores too."""
    from nki_kernels.buckets import bucket
    monkeypatch.setattr(work, "STATIC_ROW_COST_CHUNKS", -1e9)
    lens = [int(n) for n in rng.integers(low, high + 1, rows)]
    assert 0 < static_pass(_req(lens), 16, bucket(rows), 1) * rows <= work.STATIC_MAX_SLOTS
    args = make_decode_case(rng, lens, 16, 8, 1, 128, q_dtype=np.float32,
                            kv_dtype=np.float32)
    ref, ref_lse = batch_decode_ref(*args, return_lse=True)
    for lnc in (1, 2):
        with simulate.use_target("trn2"):
            out, lse = batch_decode(*args, return_lse=True, lnc=lnc)
            assert not simulate.last_trace().loops
        np.testing.assert_allclose(out, ref, rtol=2e-5, atol=2e-5)
        np.testing.assert_allclose(lse, ref_lse, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("G, rows, low, high", [
    (16, 32, 257, 384), pytest.param(8, 32, 300, 1024, marks=pytest.mark.slow),
    pytest.param(8, 64, 100, 900, marks=pytest.mark.slow)])
def test_rows_of_large_stationaries_fit_sbuf(rng, monkeypatch, G, rows, low, high):
    """Eight kv heads of 256 in bf16 at GQA 16 (4 KiB of query stationaries a row) or 8: 32
    static rows, each with its own stationaries, overflowed SBUF; from a pool of a few
    (kernel.static_prep) they fit, whatever the policy's costs, matching the reference."""
    import ml_dtypes
    monkeypatch.setattr(work, "STATIC_ROW_COST_CHUNKS", -1e9)
    lens = [int(n) for n in rng.integers(low, high + 1, rows)]
    bf16 = ml_dtypes.bfloat16
    args = make_decode_case(rng, lens, 16, 8, G, 256, q_dtype=bf16, kv_dtype=bf16)
    with simulate.use_target("trn2"):
        out = batch_decode(*args)
        assert not simulate.last_trace().loops
    assert_close(out, batch_decode_ref(*args), dtype="bfloat16")


def test_its_table_covers_each_request_and_pads_the_bucket():
    req = _req([300, 0, 40])
    table = static_work(req, 16, 4, 4, NullItems(slot=77, out=4)).items
    assert table.shape == (4, work.META_COLS)
    assert list(table[:, work.OUT]) == [0, 1, 2, 3]
    assert list(table[:3, work.LEN]) == [300, 0, 40] and table[3, work.LEN] == 0
    assert (table[:, work.C1] - table[:, work.C0] == 4).all()
    assert table[3, work.PTR] == table[3, work.SLOT0] == 77


@pytest.mark.parametrize("case", [
    dict(lens=[1000]), dict(lens=[300, 0]), dict(lens=[129, 5], window_left=60),
    dict(lens=[700], sinks=True), dict(lens=[1900], soft_cap=20.0), dict(lens=[1000], lnc=2),
    dict(lens=[600, 47, 900], lnc=2)])
def test_it_matches_the_reference_and_the_loops_byte_for_byte(rng, monkeypatch, case):
    args = make_decode_case(rng, case["lens"], 16, 2, 4, 64)
    kw = dict(window_left=case.get("window_left", -1),
              logits_soft_cap=case.get("soft_cap", 0.0), return_lse=True)
    if case.get("sinks"):
        kw["sinks"] = rng.standard_normal(8).astype(np.float32)
    with simulate.use_target("trn2"):
        out, lse = batch_decode(*args, **kw, lnc=case.get("lnc", 1))
        trace = simulate.last_trace()
        assert trace.program_instructions > 0
        monkeypatch.setattr(work, "STATIC_MAX_SLOTS", 0)
        out_l, lse_l = batch_decode(*args, **kw, lnc=case.get("lnc", 1))
        looped = simulate.last_trace()
    assert not trace.loops and looped.loops              # no device loop in the static pass
    ref, ref_lse = batch_decode_ref(*args, **kw)
    np.testing.assert_allclose(out, ref, rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(lse, ref_lse, rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(out, out_l, rtol=1e-6, atol=1e-6)
    # the padding chunks and the bucket's padded rows read no keys
    assert _moved(trace, "k_rows") == _moved(looped, "k_rows")


@pytest.mark.sim_only
def test_it_compiles_once_per_chunk_count(rng):
    """One cache, a growing request: 5-6 chunks share a compile, 7-8 take a second, 9-12 a
    third."""
    cache = FixedCache(rng, pages=200)
    with simulate.use_target("trn2"):
        simulate.reset_compile_stats()
        for n in (600, 700, 1000, 1100, 1500):
            batch_decode(*cache.step([n]))
            assert not simulate.last_trace().loops
        assert simulate.compile_stats(batch_decode_kernel)["compilations"] == 3


def test_trn1_keeps_the_loops(rng):
    with simulate.use_target("trn1"):
        batch_decode(*make_decode_case(rng, [1000], 16, 2, 2, 32))
        assert simulate.last_trace().loops


def test_one_request_on_two_cores_splits_its_chunk_slots():
    """A bucket of one row under LNC=2 (work.static_split): table row p is core p's half, the
    request's chunk slots from c0 + p * chunks, both writing output row 0."""
    null = NullItems(slot=77, out=1)
    table = static_work(_req([1000]), 16, 1, 4, null, cores=2).items
    assert table.shape == (2, work.META_COLS)
    assert list(table[:, work.C0]) == [0, 4] and list(table[:, work.C1]) == [4, 8]
    assert list(table[:, work.LEN]) == [1000, 1000] and list(table[:, work.OUT]) == [0, 0]
    assert list(table[:, work.SLOT0]) == [0, 32]             # 8 pages of 16 a chunk
    empty = static_work(_req([]), 16, 1, 1, null, cores=2).items       # no request
    assert list(empty[:, work.PTR]) == [77, 77] and list(empty[:, work.LEN]) == [0, 0]
    assert static_work(_req([1000]), 16, 1, 8, null).items.shape == (1, work.META_COLS)


@pytest.mark.parametrize("lens, options", [
    ([1000], {}), ([1024], {}), ([100], {}), ([129], {}), ([0], {}), ([3000], {}),
    ([700], {"window_left": 60}), ([900], {"window_left": 600}), ([700], {"sinks": True}),
    ([1900], {"logits_soft_cap": 20.0})], ids=str)
def test_a_split_request_matches_the_reference(rng, lens, options):
    """Keys on one core only (one chunk: the other half reads none; no keys at all), a window
    that starts in the first or the second half, sinks and a soft cap added once."""
    args = make_decode_case(rng, lens, 16, 2, 4, 64)
    options = dict(options)
    if options.pop("sinks", False):
        options["sinks"] = rng.standard_normal(8).astype(np.float32)
    with simulate.use_target("trn2"):
        out, lse = batch_decode(*args, return_lse=True, lnc=2, **options)
        trace = simulate.last_trace()
    assert not trace.loops
    assert any(e.op == "sendrecv" for e in trace.events)          # the halves merged
    ref, ref_lse = batch_decode_ref(*args, return_lse=True, **options)
    np.testing.assert_allclose(out, ref, rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(lse, ref_lse, rtol=2e-5, atol=2e-5)


def test_full_slots_are_the_leading_slots_every_row_fills():
    """Slots that skip no token of any row with keys: all ``chunks`` of them, or 0 (a static
    argument of two values: a bucket compiles for no others)."""
    full = work.static_full_slots
    assert full(_req([512, 512]), 16, 2, 4) == 4                 # 4 chunks of 128 each
    assert full(_req([512, 511]), 16, 2, 4) == 0                 # one token short of slot 3
    assert full(_req([512, 511]), 16, 2, 3) == 3                 # the first 3 whole in both
    assert full(_req([513, 640]), 16, 2, 6) == 0                 # 4 and 5 whole chunks
    assert full(_req([513, 640]), 16, 2, 4) == 4
    assert full(_req([900, 640]), 16, 2, 8) == 0
    assert full(_req([0, 300]), 16, 2, 3) == 0                   # a row with no keys
    assert full(_req([127]), 16, 1, 1) == 0
    assert full(_req([512]), 16, 4, 4) == 4                      # rows past the batch: ignored
    # a window from position 100: the first slot starts before it
    assert full(_req([512], window_left=411), 16, 1, 4) == 0
    # a window from position 128 (a chunk boundary): slots from chunk 1 on, 3 whole
    assert full(_req([512], window_left=383), 16, 1, 3) == 3
    # one request split between two cores: each core's slots of its half
    assert full(_req([512]), 16, 1, 2, cores=2) == 2
    assert full(_req([500]), 16, 1, 2, cores=2) == 0             # the second half's last
    assert full(_req([500]), 16, 1, 1, cores=2) == 1


@pytest.mark.parametrize("lens, cores", [([512, 511, 640], 1), ([512, 511, 640], 2), ([511], 2),
                                         ([384, 200], 1)])
def test_skipped_v_rows_read_zero_where_a_slot_is_not_full(rng, lens, cores):
    """NaN in every cache entry past each request's keys: a slot whose V tile skipped a row
    without zeroing it would bring the NaN into the output (0 * NaN)."""
    from nki_kernels.buckets import bucket
    cache = FixedCache(rng, pages=200)
    q, kv, indptr, pages, last, layout = cache.step(lens)
    for b, n in enumerate(lens):                 # every unused entry of the request's pages
        for t in range(n, (indptr[b + 1] - indptr[b]) * cache.P):
            kv[pages[indptr[b] + t // cache.P], :, t % cache.P] = np.nan
    used = set(pages.tolist())
    for p in range(kv.shape[0]):                 # and every page no request holds
        if p not in used:
            kv[p] = np.nan
    req = _req(lens)
    chunks = static_pass(req, 16, bucket(len(lens)), cores)
    assert chunks and work.static_full_slots(req, 16, bucket(len(lens)), chunks, cores) < chunks
    with simulate.use_target("trn2"):
        out = batch_decode(q, kv, indptr, pages, last, layout, lnc=cores)
        assert not simulate.last_trace().loops
    assert np.isfinite(out).all()
    np.testing.assert_allclose(out, batch_decode_ref(q, kv, indptr, pages, last, layout),
                               rtol=2e-5, atol=2e-5)


def test_two_cores_take_balanced_halves_of_a_spread_batch():
    """Under LNC=2 core p runs rows [p * half, (p + 1) * half): the requests are dealt so each
    half's chunks balance; one core (or a split bucket of one) keeps request order."""
    chunks = lambda lens: [-(-n // 128) for n in lens]           # noqa: E731
    lens = [100, 333, 566, 800]
    rows = work.static_rows_of(_req(lens), 4, 2)
    assert sorted(rows.tolist()) == [0, 1, 2, 3]
    halves = [sum(c for c, r in zip(chunks(lens), rows) if r // 2 == p) for p in range(2)]
    assert halves == [8, 8]                          # 1 + 7 and 3 + 5 (request order: 4, 12)
    rows = work.static_rows_of(_req([2000, 100, 100, 100, 100]), 8, 2)
    assert (rows < 4).sum() == 1 or (rows >= 4).sum() == 1      # the long one alone on a core
    assert len(set(rows.tolist())) == 5 and rows.max() < 8
    assert (rows[[1, 2, 3, 4]] // 4 == rows[[1, 2, 3, 4]][0] // 4).all()
    np.testing.assert_array_equal(work.static_rows_of(_req(lens), 4, 1), np.arange(4))
    np.testing.assert_array_equal(work.static_rows_of(_req([900]), 1, 2), [0])
    rows = work.static_rows_of(_req([500] * 6), 8, 2)           # 3 a core, not 4 and 2
    assert sorted((rows // 4).tolist()) == [0, 0, 0, 1, 1, 1]


@pytest.mark.parametrize("lens", [[100, 333, 566, 800], [1000, 100, 100, 100, 100],
                                  [40, 700, 9, 1500, 256, 3]])
def test_a_balanced_lnc2_pass_returns_each_request_its_own_rows(rng, lens):
    """Requests reordered across the cores' halves come back in request order, from batch_decode
    and from a decode-only batch_prefill."""
    from nki_kernels.buckets import bucket
    from nki_kernels.paged_attention import batch_prefill, batch_prefill_ref
    req = _req(lens)
    assert static_pass(req, 16, bucket(len(lens)), 2)
    assert (work.static_rows_of(req, bucket(len(lens)), 2) != np.arange(len(lens))).any()
    cache = FixedCache(rng, pages=300)
    q, kv, *table = cache.step(lens)
    with simulate.use_target("trn2"):
        out, lse = batch_decode(q, kv, *table, lnc=2, return_lse=True)
        assert not simulate.last_trace().loops
        qo = np.arange(len(lens) + 1, dtype=np.int32)
        pre = batch_prefill(q, kv, qo, *table[:3], causal=True, lnc=2)
    ref, ref_lse = batch_decode_ref(q, kv, *table, return_lse=True)
    np.testing.assert_allclose(out, ref, rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(lse, ref_lse, rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(pre, batch_prefill_ref(q, kv, qo, *table[:3], causal=True),
                               rtol=2e-5, atol=2e-5)


def test_an_odd_bucket_on_two_cores_keeps_the_loops(rng):
    """Under LNC=2 a static pass gives each core half its rows: a bucket of 9 (growth 1.5)
    would leave its last row to no core, so such a step loops and every request is computed."""
    from nki_kernels.buckets import BucketPolicy, set_bucket_policy
    lens = [300, 200, 250, 100, 90, 280, 310, 60, 150]
    assert static_pass(_req(lens), 16, 9, cores=2) == 0
    assert static_pass(_req(lens), 16, 9, cores=1) > 0          # one core runs all nine rows
    previous = set_bucket_policy(BucketPolicy(1, 1.5))
    try:
        cache = FixedCache(rng, pages=300)
        q, kv, *table = cache.step(lens)
        with simulate.use_target("trn2"):
            out = batch_decode(q, kv, *table, lnc=2)
    finally:
        set_bucket_policy(previous)
    np.testing.assert_allclose(out, batch_decode_ref(q, kv, *table), rtol=2e-5, atol=2e-5)


def _expected_slot_rows(lens, indptr, pages, P, rpp, es, chunks, window_left, table):
    """Token by token: table row r's chunk k, token t is position C0*T + k*T + t of its request
    (found by its LEN and first slot), at page pages[indptr[b] + pos // P], entry pos % P."""
    T = work.chunk_tokens(P)
    out = np.full((T, table.shape[0] * chunks), work.SKIPPED_ROW, np.int64)
    for r in range(table.shape[0]):
        L, W, c0 = table[r, work.LEN], table[r, work.WIN], table[r, work.C0]
        ptr = table[r, work.PTR]
        for k in range(chunks):
            for t in range(T):
                pos = c0 * T + k * T + t
                if pos < L and (window_left < 0 or pos >= W):
                    out[t, r * chunks + k] = pages[ptr + pos // P] * rpp + (pos % P) * es
    return out


@pytest.mark.parametrize("lens, cores, window_left, P", [
    ([300, 0, 40], 1, -1, 16), ([129, 5, 700], 1, 60, 16), ([1000], 2, -1, 16),
    ([517, 33], 2, 100, 32), ([90, 200, 1], 1, -1, 8)])
def test_slot_rows_are_each_token_slots_cache_row(rng, lens, cores, window_left, P):
    """The host's static-pass rows, against a token-by-token count: the request's page and entry
    for a key inside [W, L), SKIPPED_ROW (past any cache the pass reads) elsewhere."""
    from nki_kernels.buckets import bucket
    lens = np.asarray(lens)
    npages = -(-lens // P)
    indptr = np.concatenate([[0], np.cumsum(npages)])
    pages = rng.permutation(int(indptr[-1]) + 50)[:int(indptr[-1])].astype(np.int64)
    req = query_blocks(indptr, lens, np.ones_like(lens), 1, window_left, True, P)
    rows = bucket(len(lens))
    chunks = work.static_chunk_count(max(1, int(-(-lens.max() // work.chunk_tokens(P)))))
    if cores == 2 and rows == 1:
        chunks = -(-chunks // 2)
    padded = np.concatenate([pages, np.full(work.chunk_tokens(P), 10 ** 6)]).reshape(-1, 1)
    table = static_work(req, P, rows, chunks, NullItems(slot=int(indptr[-1]), out=rows),
                        cores).items
    rpp, es = 3 * P, 3                       # three kv heads a row of the row view
    got = work.static_slot_rows(table, padded, P, rpp, es, chunks, window_left >= 0)
    want = _expected_slot_rows(lens, indptr, padded[:, 0], P, rpp, es, chunks, window_left,
                               table)
    assert got.dtype == np.int32 and got.shape == want.shape
    np.testing.assert_array_equal(got, want)
    assert (got[got != work.SKIPPED_ROW] < work.SKIPPED_ROW).all()


@pytest.mark.parametrize("sm_scale", [0.05, 1.0, 3.0])
@pytest.mark.parametrize("lnc", [1, 2])
def test_a_request_without_keys_gives_zero_and_minus_inf_at_any_scale(rng, sm_scale, lnc):
    """A masked score takes NEG_BIG / scale (-inf below 1) so the scale may join the exponent:
    a row that sees no key still ends with l = 0 or the identity's max, out 0 and LSE -inf."""
    args = make_decode_case(rng, [70, 0, 300, 0], 16, 2, 4, 64)
    with simulate.use_target("trn2"):
        out, lse = batch_decode(*args, sm_scale=sm_scale, return_lse=True, lnc=lnc)
        assert not simulate.last_trace().loops
    ref, ref_lse = batch_decode_ref(*args, sm_scale=sm_scale, return_lse=True)
    assert (out[[1, 3]] == 0).all() and np.isneginf(lse[[1, 3]]).all()
    assert_close(out, ref, lse, ref_lse)


@pytest.mark.parametrize("lens, cores", [([700], 1), ([700, 300, 1000], 1), ([1000], 2)])
def test_a_pass_gathers_each_chunks_k_before_the_v_of_the_chunk_before(rng, monkeypatch, lens,
                                                                       cores):
    """K leads V by one gather (kernel_items.k_first): K0, K1, V0, K2, V1, ..., V(n-1) in
    program order (a packed gather: each of its p requests' K, then the p V of the gather
    before), every V gathered once, and the output still the reference's (one section:
    ``work.static_sections`` would split the spread batch)."""
    import ml_dtypes
    monkeypatch.setattr(work, "STATIC_MAX_SECTIONS", 1)
    args = make_decode_case(rng, lens, 16, 8, 4, 128, q_dtype=ml_dtypes.bfloat16,
                            kv_dtype=ml_dtypes.bfloat16)
    with simulate.use_target("trn2"):
        out = batch_decode(*args, lnc=cores)
        trace = simulate.last_trace()
    assert not trace.loops
    order = ""
    for e in trace.events:
        if e.engine == "dma" and any(o.indirect == "vector" for o in e.operands):
            order += "K" if e.operands[0].tensor.startswith("kT") else "V"
    n = order.count("K")
    assert n >= 4 * cores and order.count("V") == n
    half = order[:len(order) // cores]           # the cores trace one after the other
    p = 4 if len(lens) > 1 else 1                 # requests a gather packs (work.static_pack)
    gathers = n // cores // p
    assert half == "K" * p + ("K" * p + "V" * p) * (gathers - 1) + "V" * p
    assert_close(out, batch_decode_ref(*args), dtype="bfloat16")
