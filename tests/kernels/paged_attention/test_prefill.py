"""batch_prefill (ragged queries: speculative verification, chunked prefill, mixed batches) in the
simulator vs the float64 reference, on trn1 and trn2."""

import ml_dtypes
import numpy as np
import pytest

from nki_kernels import simulate
from nki_kernels.paged_attention import batch_decode, batch_decode_kernel
from nki_kernels.paged_attention.work import query_blocks
from nki_kernels.paged_attention import batch_prefill
from nki_kernels.paged_attention.plan import query_block
from nki_kernels.paged_attention.reference import batch_prefill_ref

from .conftest import assert_close, make_decode_case


def make_prefill_case(rng, q_lens, kv_lens, page_size, H, G, D, q_dtype=np.float32,
                      kv_dtype=np.float32, layout="NHD", fused=True):
    """(q [sum q_lens, H*G, D], cache, qo_indptr, kv_indptr, kv_indices, last, layout): the cache
    holds kv_lens tokens per request (NaN elsewhere)."""
    _, cache, kv_indptr, kv_indices, last, layout = make_decode_case(
        rng, kv_lens, page_size, H, G, D, kv_dtype=kv_dtype, layout=layout, fused=fused)
    qo_indptr = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    q = rng.standard_normal((int(qo_indptr[-1]), H * G, D)).astype(q_dtype)
    return q, cache, qo_indptr, kv_indptr, kv_indices, last, layout


def check(args, dtype="float32", lnc=1, **options):
    out, lse = batch_prefill(*args, return_lse=True, lnc=lnc, **options)
    ref, ref_lse = batch_prefill_ref(*args, return_lse=True, **options)
    assert out.shape == ref.shape and out.dtype == args[0].dtype
    assert_close(out, ref, lse, ref_lse, dtype=dtype)
    return out, lse


GRID = [  # q_lens, kv_lens (q_len <= kv_len), page_size: straddling page and chunk boundaries
    ([1, 2, 7, 8], [1, 17, 16, 129], 16),
    ([2, 8], [127, 129], 128),
    ([129], [129], 1),
    ([7, 129, 1], [300, 257, 40], 8),
    ([1000], [1000], 16),
    ([8, 1000], [8, 2100], 256),
]


@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("q_lens, kv_lens, page_size", GRID, ids=str)
def test_causal_matches_reference(rng, target, q_lens, kv_lens, page_size, layout):
    check(make_prefill_case(rng, q_lens, kv_lens, page_size, 2, 4, 32, layout=layout),
          causal=True)


@pytest.mark.parametrize("group", [1, 3, 8])
@pytest.mark.parametrize("q_lens, kv_lens", [([4, 1, 7], [40, 9, 7]), ([130], [200])], ids=str)
def test_group_sizes(rng, target, group, q_lens, kv_lens):
    H = 3 if group < 8 else 1
    check(make_prefill_case(rng, q_lens, kv_lens, 16, H, group, 64, fused=False), causal=True)


@pytest.mark.parametrize("D", [128, 256])
def test_head_dims_over_128(rng, D):
    check(make_prefill_case(rng, [5, 2], [33, 130], 16, 2, 2, D), causal=True)


@pytest.mark.parametrize("options", [
    dict(causal=False), dict(causal=False, window_left=5), dict(window_left=0),
    dict(window_left=20), dict(logits_soft_cap=3.0, sm_scale=0.2),
    dict(sinks=np.linspace(-1, 2, 6).astype(np.float32)),
    dict(window_left=33, sinks=np.ones(6, np.float32), logits_soft_cap=2.0),
], ids=lambda o: ",".join(o))
def test_options(rng, target, options):
    args = make_prefill_case(rng, [7, 1, 40, 0, 3], [70, 1, 150, 5, 3], 16, 2, 3, 32)
    check(args, **{"causal": True, **options})


@pytest.mark.parametrize("q_dtype, kv_dtype", [
    ("float16", "float16"), ("bfloat16", "bfloat16"), ("bfloat16", "float8_e4m3fn"),
    ("bfloat16", "float8_e5m2")])
def test_dtypes(rng, target, q_dtype, kv_dtype):
    qd, kd = (np.dtype(getattr(ml_dtypes, n, None) or n) for n in (q_dtype, kv_dtype))
    args = make_prefill_case(rng, [4, 19], [40, 19], 8, 2, 2, 64, q_dtype=qd, kv_dtype=kd)
    scales = dict(k_scale=0.5, v_scale=2.0) if "float8" in kv_dtype else {}
    coarser = "bfloat16" if "bfloat16" in (q_dtype, kv_dtype) else q_dtype
    check(args, dtype=kv_dtype if "float8" in kv_dtype else coarser, causal=True, **scales)


def test_two_cores_split_a_block(rng):
    """LNC=2: the work of one long prefill chunk is cut between the cores inside one query block
    (split-KV), partial states merged on device."""
    args = make_prefill_case(rng, [9, 64, 1], [500, 900, 3], 16, 2, 4, 32)
    with simulate.use_target("trn2"):
        one = check(args, causal=True)
        two = check(args, causal=True, lnc=2)
    np.testing.assert_allclose(one[0], two[0], atol=2e-6)


@pytest.mark.sim_only
def test_one_query_per_request_is_decode_exactly(rng, target):
    """q_len 1 everywhere: the same launch as batch_decode (same program, bit-identical out)."""
    args = make_prefill_case(rng, [1, 1, 1], [33, 0, 129], 16, 2, 4, 32)
    q, cache, _, kv_indptr, kv_indices, last, layout = args
    before = simulate.compile_stats(batch_decode_kernel)["compilations"]
    d_out, d_lse = batch_decode(q, cache, kv_indptr, kv_indices, last, layout, return_lse=True)
    p_out, p_lse = batch_prefill(*args, causal=False, return_lse=True)   # kv_len 0 allowed
    assert np.array_equal(d_out, p_out) and np.array_equal(d_lse, p_lse)
    assert simulate.compile_stats(batch_decode_kernel)["compilations"] - before <= 1


def test_forked_requests_share_prefix_pages(rng, target):
    """Prefix caching: two requests fork from one prompt (their page lists share its first
    pages), each then verifying its own draft tokens."""
    q, cache, _, kv_indptr, kv_indices, last, layout = make_prefill_case(
        rng, [4], [37], 8, 2, 2, 32)
    prefix = kv_indices[:4]                       # 32 shared tokens, then one private page each
    free = np.setdiff1d(np.arange(cache.shape[0]), kv_indices).astype(np.int32)
    cache[free[:2]] = cache[kv_indices[4]]        # each branch's tail page starts as a copy
    cache[free[1], :, 3:] = 0.5                    # branch 1 diverges after 3 tokens
    kv_indices = np.concatenate([prefix, free[:1], prefix, free[1:2]]).astype(np.int32)
    kv_indptr = np.array([0, 5, 10], np.int32)
    last = np.array([5, 7], np.int32)
    qo_indptr = np.array([0, 3, 5], np.int32)
    q = rng.standard_normal((5, 4, 32)).astype(np.float32)
    out, _ = check((q, cache, qo_indptr, kv_indptr, kv_indices, last, layout), causal=True)
    assert np.isfinite(out).all()


def test_items_visit_only_the_chunks_their_queries_see():
    """Chunked prefill: a 1000-token chunk over a 5000-token prefix is 256-query blocks (G 4: eight
    tiles of 32 tokens x 4 heads), each gathering only the chunks below its last query's position
    (work ~ visible keys)."""
    P, T = 16, 128
    kv, ql = np.array([6000]), np.array([1000])
    qb = query_block(1000, 4, 8, 128)
    items = query_blocks(np.array([0, 375]), kv, ql, qb, -1, True, P)
    assert qb == 256 and items.L.size == 4
    last_pos = np.minimum(5000 + np.arange(4) * 256 + 255, 5999)   # each block's last query
    np.testing.assert_array_equal(items.L, last_pos + 1)
    np.testing.assert_array_equal(items.c1, -(-(last_pos + 1) // T))
    assert (items.c0 == 0).all()
    window = query_blocks(np.array([0, 375]), kv, ql, qb, 255, True, P)
    np.testing.assert_array_equal(window.W, 5000 + np.arange(4) * 256 - 255)
    assert ((window.c1 - window.c0) <= -(-(255 + 256) // T) + 1).all()  # window + block, no more


def test_query_block_size():
    """Powers of two while one tile (128 // G tokens) holds the block, then as many whole tiles as
    the longest request fills (no padding tile: 3, 5, 7), up to 8, fewer when the item's per-tile
    state would not fit (many kv heads of a wide head dim)."""
    sizes = [query_block(n, 4, 8, 128)
             for n in (0, 1, 2, 3, 7, 8, 9, 32, 33, 64, 65, 96, 129, 200, 256, 1000)]
    assert sizes == [1, 1, 2, 4, 8, 8, 16, 32, 64, 64, 96, 96, 160, 224, 256, 256]
    assert query_block(1000, 128) == 8 and query_block(5, 3) == 8 and query_block(80, 3) == 84
    assert query_block(100, 3) == 126                      # 3 tiles of 42 tokens
    # two cores: the longest request keeps two blocks at least (one whole unit per core)
    assert [query_block(n, 4, 8, 128, cores=2) for n in (16, 64, 65, 160, 256, 257, 1000)] == [
        16, 32, 64, 96, 128, 160, 256]
    assert query_block(1000, 4, 8, 512) == 64 and query_block(1000, 4, 64, 512) == 32
    assert query_block(100, 4, 8, 512) == 64              # two tiles fit: 4 would not


def test_query_block_candidates_after_a_whole_count_are_powers_of_two():
    from nki_kernels.paged_attention.plan import query_block_candidates
    assert query_block_candidates(256, 4) == [256, 128, 64, 32]
    assert query_block_candidates(160, 4) == [160, 128, 64, 32]
    assert query_block_candidates(96, 4) == [96, 64, 32]
    assert query_block_candidates(64, 4) == [64, 32]
    assert query_block_candidates(32, 4) == [32]
    assert query_block_candidates(48, 8) == [48, 32]       # 16 queries: a flat list's item


@pytest.mark.parametrize("lnc", [1, 2])
@pytest.mark.parametrize("q_lens, kv_lens", [
    ([96, 96, 40], [96, 700, 300]),          # three tiles of 32 queries (G 4), a short one
    ([160, 1], [900, 50]),                   # five tiles (LNC=2: blocks of three), decode beside
    ([224, 200], [224, 1300]),               # seven tiles, the second request's last one part
], ids=str)
def test_blocks_of_whole_tile_counts_match_reference(rng, target, lnc, q_lens, kv_lens):
    """Blocks of 3, 5 or 7 tiles (no power-of-two padding) over prefixes straddling chunks,
    causal, bf16, with the fused write, on one and two cores."""
    if lnc == 2 and target == "trn1":
        pytest.skip("LNC=2 is trn2's")
    assert query_block(max(q_lens), 4, 2, 64) in (96, 160, 224)
    bf16 = ml_dtypes.bfloat16
    args = make_prefill_case(rng, q_lens, kv_lens, 16, 2, 4, 64, q_dtype=bf16, kv_dtype=bf16)
    key = rng.standard_normal((args[0].shape[0], 2, 64)).astype(bf16)
    value = rng.standard_normal((args[0].shape[0], 2, 64)).astype(bf16)
    out, lse, appended = _fused_then_append(args, key, value, kv_lens, lnc)
    ref, ref_lse = batch_prefill_ref(*appended, causal=True, return_lse=True)
    assert_close(out, ref, lse, ref_lse, dtype="bfloat16")


def _problem(q_lens, kv_lens, page_size=16, H=8, G=4, D=128):
    """(prob, cache) of a bf16 Llama-like launch whose requests hold ``kv_lens`` keys."""
    from nki_kernels.paged_attention.checks import check_batch_decode_inputs
    rng = np.random.default_rng(0)
    q, cache, qo, kv_indptr, kv_indices, last, layout = make_prefill_case(
        rng, [1] * len(kv_lens), kv_lens, page_size, H, G, D, kv_dtype=ml_dtypes.bfloat16)
    prob = check_batch_decode_inputs(q[:len(kv_lens)], cache, kv_indptr, kv_indices, last, layout,
                                     None, 0.0, -1, None, 1.0, 1.0)
    return prob, cache


def test_prefill_query_block_follows_the_work():
    """Items compute every tile, padding or not: a prompt's short last chunk over a long prefix
    beside a full chunk takes smaller items (the padding's score passes cost more than reading
    the full chunk's keys again) while the step's gathers stay within QB_GATHER_LIMIT x its
    keys (here a mixed step: 12k keys of decode requests beside); alone, the re-reads would
    pass the limit and the block stays. Full chunks keep the largest block."""
    from nki_kernels.paged_attention.plan import prefill_query_block
    prob, cache = _problem([40, 256], [1840, 512])
    q_lens = np.array([40, 256])
    assert query_block(256, 4, 8, 128) == 256
    assert prefill_query_block(prob, q_lens, cache, -1, True, step_keys=14000) in (64, 128)
    assert prefill_query_block(prob, q_lens, cache, -1, True) == 256
    prob, cache = _problem([256, 256], [1024, 512])
    assert prefill_query_block(prob, np.array([256, 256]), cache, -1, True, step_keys=14000) == 256
    prob, cache = _problem([20], [700])                  # one tile: nothing to choose
    assert prefill_query_block(prob, np.array([20]), cache, -1, True) == 32
    prob, cache = _problem([16], [300], H=4, G=16, D=64)  # two tiles of a flat list's item
    assert prefill_query_block(prob, np.array([16]), cache, -1, True) == 16


def test_two_cores_halve_the_blocks_only_of_a_request_holding_most_of_the_work():
    """LNC=2: a launch whose one request holds most of its work (queries x keys) splits that
    request's queries into two blocks at least, so each core runs a whole unit; among several
    comparable requests the blocks stay whole (halving them would read every request's keys
    twice: ten chunks of 64 gathered 1.67x the minimum bytes)."""
    from nki_kernels.paged_attention.plan import dominant_request, prefill_query_block
    assert dominant_request([256, 16], [1200, 300]) and dominant_request([64], [64])
    assert not dominant_request([64] * 10, [1500, 100, 800, 900, 300, 1200, 700, 600, 400, 1000])
    assert not dominant_request([], [])
    lens = [1300, 1000, 900, 600]
    prob, cache = _problem([64] * 4, lens)
    assert prefill_query_block(prob, np.array([64] * 4), cache, -1, True, cores=2) == 64
    prob, cache = _problem([64, 8], [1300, 100])
    assert prefill_query_block(prob, np.array([64, 8]), cache, -1, True, cores=2) == 32
    assert prefill_query_block(prob, np.array([64, 8]), cache, -1, True, cores=1) == 64


@pytest.mark.parametrize("target", ["trn1", "trn2"])
def test_mixed_chunk_lengths_in_smaller_items(target):
    """A mixed step whose prompt launch the block policy cuts into smaller items (a short last
    chunk over a long prefix beside a full chunk, decode requests beside) matches the
    reference, causal, bf16."""
    from nki_kernels.paged_attention.plan import prefill_query_block
    rng = np.random.default_rng(7)
    q_lens, kv_lens = [37, 130, 1, 1, 1], [1100, 300, 1500, 1500, 1500]
    args = make_prefill_case(rng, q_lens, kv_lens, 16, 2, 4, 64, q_dtype=ml_dtypes.bfloat16,
                             kv_dtype=ml_dtypes.bfloat16)
    prob, cache = _problem(q_lens[:2], kv_lens[:2], H=2, D=64)
    assert prefill_query_block(prob, np.array(q_lens[:2]), cache, -1, True,
                               step_keys=sum(kv_lens)) < query_block(130, 4, 2, 64)
    with simulate.use_target(target):
        check(args, dtype="bfloat16", causal=True)


@pytest.mark.parametrize("bad, rule", [
    (dict(qo_indptr=np.array([0, 3, 2], np.int32)), "non-decreasing"),
    (dict(qo_indptr=np.array([1, 2, 5], np.int32)), r"qo_indptr\[0\]"),
    (dict(qo_indptr=np.array([0, 2, 4], np.int32)), r"qo_indptr\[-1\]=4 must equal"),
    (dict(qo_indptr=np.array([0, 5], np.int32)), "qo_indptr"),
    (dict(qo_indptr=np.array([0, 2, 5], np.int64)), "qo_indptr"),
    (dict(causal=1), "causal"),
], ids=lambda x: x if isinstance(x, str) else ",".join(x))
def test_bad_inputs_refused_by_name(rng, bad, rule):
    q, cache, qo_indptr, kv_indptr, kv_indices, last, layout = make_prefill_case(
        rng, [2, 3], [4, 9], 4, 1, 2, 16)
    kw = {"qo_indptr": qo_indptr, "causal": True, **bad}
    with pytest.raises((ValueError, TypeError), match=rule):
        batch_prefill(q, cache, kw["qo_indptr"], kv_indptr, kv_indices, last, layout,
                      causal=kw["causal"])


def test_causal_needs_the_new_tokens_in_the_cache(rng):
    args = make_prefill_case(rng, [5, 3], [4, 9], 4, 1, 2, 16)
    with pytest.raises(ValueError, match="request 0 has 5 queries .* 4 keys"):
        batch_prefill(*args, causal=True)
    out = batch_prefill(*args, causal=False)          # not causal: any q_len
    assert_close(out, batch_prefill_ref(*args, causal=False))


def _fused_case(rng, q_lens, kv_lens, layout, pair):
    """A prefill case whose new tokens' K/V are not yet in the cache, and those rows."""
    q, cache, qo_indptr, kv_indptr, kv_indices, last, layout = make_prefill_case(
        rng, q_lens, kv_lens, 16, 2, 2, 32, layout=layout, fused=not pair)
    H, D = 2, 32
    key = rng.standard_normal((q.shape[0], H, D)).astype(np.float32)
    value = rng.standard_normal((q.shape[0], H, D)).astype(np.float32)
    return (q, cache, qo_indptr, kv_indptr, kv_indices, last, layout), key, value


def _copy(cache):
    return tuple(c.copy() for c in cache) if isinstance(cache, tuple) else cache.copy()


@pytest.mark.parametrize("layout, pair, lnc", [("NHD", False, 1), ("HND", True, 1),
                                               ("NHD", True, 2), ("HND", False, 2)])
def test_fused_write_equals_separate_append(rng, target, layout, pair, lnc):
    """append_key/append_value: the launch writes the new rows, then attends to them; the cache
    bytes equal append_paged_kv_cache's, the output equals attention after that append."""
    if lnc == 2 and target == "trn1":
        pytest.skip("LNC=2 is a trn2 launch")
    args, key, value = _fused_case(rng, [3, 1, 130, 0], [20, 5, 300, 7], layout, pair)
    out, _, args = _fused_then_append(args, key, value, [20, 5, 300, 7], lnc)
    assert np.array_equal(out, batch_prefill(*args, causal=True, lnc=lnc))
    assert_close(out, batch_prefill_ref(*args, causal=True))


def _fused_then_append(args, key, value, kv_lens, lnc):
    """A causal launch with the fused write of ``key``/``value`` on a copy of the case's cache,
    and the same rows appended to another copy by ``append_paged_kv_cache``; asserts the two
    caches are byte-equal. Returns (out, lse, the case's arguments over the appended cache)."""
    from nki_kernels.paged_kv_append import append_paged_kv_cache, get_batch_indices_positions
    q, cache, qo_indptr, kv_indptr, kv_indices, last, layout = args
    fused, separate = _copy(cache), _copy(cache)
    out, lse = batch_prefill(q, fused, qo_indptr, kv_indptr, kv_indices, last, layout,
                             causal=True, return_lse=True, append_key=key, append_value=value,
                             lnc=lnc)
    batch, pos = get_batch_indices_positions(qo_indptr, np.array(kv_lens, np.int32), q.shape[0])
    append_paged_kv_cache(key, value, batch, pos, separate, kv_indices, kv_indptr, last, layout)
    pair = isinstance(cache, tuple)
    for a, b in zip(*(c if pair else (c,) for c in (fused, separate))):
        assert np.array_equal(a, b, equal_nan=True)
    return out, lse, (q, separate, qo_indptr, kv_indptr, kv_indices, last, layout)


@pytest.mark.parametrize("bad, rule", [
    (dict(append_value=None), "give both or neither"),
    (dict(append_key=np.zeros((4, 2, 32), np.float32),
          append_value=np.zeros((4, 2, 32), np.float32)), "one per query token"),
    (dict(append_key=np.zeros((5, 2, 32), np.float16)), "dtype"),
], ids=["one-missing", "rows", "dtype"])
def test_fused_write_refuses_bad_rows_before_writing(rng, bad, rule):
    args, key, value = _fused_case(rng, [2, 3], [4, 9], "NHD", False)
    before = args[1].copy()
    kw = {"append_key": key, "append_value": value, **bad}
    with pytest.raises((ValueError, TypeError), match=rule):
        batch_prefill(*args, causal=True, **kw)
    assert np.array_equal(args[1], before, equal_nan=True)


def test_fused_write_refuses_a_read_only_cache_before_writing(rng):
    args, key, value = _fused_case(rng, [2, 3], [4, 9], "NHD", True)
    k_cache, v_cache = args[1]
    v_cache.flags.writeable = False
    before = k_cache.copy()
    with pytest.raises(ValueError, match="v_cache is read-only"):
        batch_prefill(*args, causal=True, append_key=key, append_value=value)
    assert np.array_equal(k_cache, before, equal_nan=True)


@pytest.mark.parametrize("H, G, q_len", [(4, 8, 8), (2, 32, 4), (8, 4, 8)])
@pytest.mark.parametrize("lnc", [1, 2])
def test_verification_over_several_score_tiles_moves_them_together(rng, target, H, G, q_len, lnc):
    """Blocks of queries whose kv heads fill two or more score tiles (G x q_len x heads > 128
    rows): their queries, states and outputs move in one DMA for all tiles; results match the
    reference with a window, sinks and a custom mask."""
    if lnc == 2 and target == "trn1":
        pytest.skip("LNC=2 is trn2's")
    q_lens, kv_lens = [q_len, q_len - 1, q_len], [q_len + 300, 150, q_len + 41]
    args = make_prefill_case(rng, q_lens, kv_lens, 16, H, G, 16)
    sinks = rng.standard_normal(H * G).astype(np.float32)
    check(args, lnc=lnc, causal=True, window_left=100)
    check(args, lnc=lnc, causal=True, sinks=sinks)
    mask = np.concatenate([rng.random(q * k) < 0.6 for q, k in zip(q_lens, kv_lens)])
    check(args, lnc=lnc, custom_mask=mask)


@pytest.mark.parametrize("q_len", [20, 100])
@pytest.mark.parametrize("lnc", [1, 2])
def test_a_bucket_of_one_block_of_queries_runs_it_without_a_loop(rng, target, q_len, lnc):
    """One request whose queries are one whole block (a bucket of one unit): the kernel runs it
    straight (under LNC=2 both cores' parts of it, merged), matching the reference."""
    if lnc == 2 and target == "trn1":
        pytest.skip("LNC=2 is trn2's")
    args = make_prefill_case(rng, [q_len], [q_len + 290], 16, 2, 4, 32)
    from nki_kernels.paged_attention.plan import query_block
    assert -(-q_len // query_block(q_len, 4, 2, 32, lnc)) == (1 if lnc == 1 or q_len <= 32 else 2)
    check(args, lnc=lnc, causal=True)
    check(args, lnc=lnc, causal=True, window_left=50)


@pytest.mark.parametrize("minimum", [1, 2])
def test_two_cores_run_a_bucket_of_two_blocks_one_each_without_a_loop(rng, minimum):
    """LNC=2, a bucket of two blocks of queries: each core runs one (no loop over units, so no
    loop is nested in another). With a bucket policy of minimum 2 a single block still does: it
    runs on core 0 and an empty one over the bucket's padded rows on core 1."""
    from nki_kernels.buckets import BucketPolicy, set_bucket_policy
    old = set_bucket_policy(BucketPolicy(minimum, 2))
    try:
        for q_lens, kv_lens in (([100], [900]), ([20], [500]), ([30, 9], [200, 700])):
            args = make_prefill_case(rng, q_lens, kv_lens, 16, 2, 4, 32)
            with simulate.use_target("trn2"):
                check(args, lnc=2, causal=True)
                loops = simulate.last_trace().loops
                check(args, lnc=2, causal=True, window_left=120)
            assert loops and not [l for l in loops if l["depth"] > 0]
    finally:
        set_bucket_policy(old)


@pytest.mark.parametrize("q_lens, kv_lens", [([100] * 4, [1300, 1000, 900, 600]),
                                             ([96] * 5, [1200, 200, 900, 800, 300])], ids=str)
def test_two_cores_share_blocks_out_of_their_order(rng, q_lens, kv_lens, monkeypatch):
    """LNC=2 gives each core blocks of queries by their work, not their order (work._whole_halves:
    a core's rows are not a run of consecutive blocks here), and every output is the
    reference's."""
    from nki_kernels.paged_attention import work
    shared = []
    halves = work._whole_halves

    def spy(*a, **k):
        ones, loads = halves(*a, **k)
        shared.append(ones.copy())
        return ones, loads
    monkeypatch.setattr(work, "_whole_halves", spy)
    args = make_prefill_case(rng, q_lens, kv_lens, 16, 2, 4, 64)
    with simulate.use_target("trn2"):
        check(args, causal=True, lnc=2)
    assert shared and (np.diff(shared[-1]) < 0).any()      # a core-1 block before a core-0 one
