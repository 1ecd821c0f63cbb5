"""The append kernel in a serving loop: one compile per token bucket, padding that does no work,
and padding sent to a reserved spare page instead of relying on oob_mode.skip."""

import numpy as np
import pytest

from nki_kernels import simulate
from nki_kernels.paged_kv_append import append_paged_kv_cache, paged_kv_scatter_kernel
from nki_kernels.paged_kv_append.api import reshape_and_cache

from nki_kernels.paged_kv_append import append_paged_kv_cache_ref

from .conftest import assert_bits_equal, make_append_case

pytestmark = pytest.mark.sim_only


def test_token_counts_compile_once_per_bucket(rng, target):
    N, P, H, D = 64, 8, 2, 8
    kc = np.full((N, P, H, D), np.nan, np.float32)
    vc = kc.copy()
    simulate.reset_compile_stats()
    counts = [1, 3, 4, 7, 20, 33, 40, 2, 129, 200]
    for T in counts:
        slots = rng.permutation(N * P)[:T].astype(np.int64)
        key = rng.standard_normal((T, H, D)).astype(np.float32)
        reshape_and_cache(key, key + 1, kc, vc, slots)
        np.testing.assert_array_equal(kc.reshape(N * P, H, D)[slots], key)
    buckets = {1, 2, 4, 8, 32, 64, 256}       # powers of two (above 128: multiples of 128)
    assert simulate.compile_stats(paged_kv_scatter_kernel)["compilations"] == len(buckets)


@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_spare_page_takes_the_padding(rng, target, layout):
    N, P, H, D = 6, 4, 2, 8
    shape = (N, P, H, D) if layout == "NHD" else (N, H, P, D)
    kc = np.full(shape, np.nan, np.float32)
    vc = kc.copy()
    key = rng.standard_normal((5, H, D)).astype(np.float32)
    slots = np.array([3, -1, 17, 0, -5], np.int64)
    reshape_and_cache(key, 2 * key, kc, vc, slots, kv_layout=layout, spare_page=5)
    view = kc if layout == "NHD" else kc.transpose(0, 2, 1, 3)
    for t, s in enumerate(slots):
        if s >= 0:
            np.testing.assert_array_equal(view[s // P, s % P], key[t])
    # pages 0-4: only the three real tokens; page 5 (spare): the padded tokens 1 and 4 at entries
    # t mod P = 1 and 0 (trn2 also writes the bucket's padding rows 5..7 there)
    assert np.isnan(kc[:5]).sum() == (5 * P - 3) * H * D
    spare = view[5]
    assert not np.isnan(spare[[0, 1]]).any()


def test_spare_page_on_flashinfer_append(rng, target):
    args = make_append_case(rng, [9, 3, 6], [9, 3, 6], 4, 2, 8)     # 18 tokens -> bucket 32
    owned = set(args[5].tolist())
    spare = next(p for p in range(args[4].shape[0]) if p not in owned)
    append_paged_kv_cache(*args, spare_page=spare)
    cache = args[4]
    if target == "trn2":                                            # the last tile's padding
        assert not np.isnan(cache[spare]).any()
    others = [p for p in range(cache.shape[0]) if p not in owned and p != spare]
    assert np.isnan(cache[others]).all()


def test_spare_page_must_be_reserved(rng):
    args = make_append_case(rng, [9, 3], [2, 1], 4, 2, 8)
    with pytest.raises(ValueError, match="spare_page=.* is one of the pages being written"):
        append_paged_kv_cache(*args, spare_page=int(args[5][0]))
    with pytest.raises(ValueError, match=r"spare_page=99 must be a page id"):
        append_paged_kv_cache(*args, spare_page=99)
    N, P, H, D = 4, 4, 1, 2
    kc = np.zeros((N, P, H, D), np.float32)
    with pytest.raises(ValueError, match="spare_page=0 is one of the pages"):
        reshape_and_cache(np.zeros((1, H, D), np.float32), np.zeros((1, H, D), np.float32), kc,
                          kc.copy(), np.array([2]), spare_page=0)


@pytest.mark.parametrize("layout,fused", [("NHD", True), ("HND", False), ("NHD", False)])
def test_lnc2_cores_write_k_and_v_each(rng, layout, fused):
    from nki_kernels.paged_kv_append import append_paged_kv_cache_ref
    args = make_append_case(rng, [37, 130, 5], [3, 130, 5], 16, 2, 8, layout=layout, fused=fused)
    expected = append_paged_kv_cache_ref(*args)
    with simulate.use_target("trn2"):
        append_paged_kv_cache(*args, lnc=2)
        trace = simulate.last_trace()
    got = args[4]
    for g, e in zip(got if isinstance(got, tuple) else (got,),
                    expected if isinstance(expected, tuple) else (expected,)):
        np.testing.assert_array_equal(g, e)
    written = {}
    for e in trace.events:
        written[e.program_id] = written.get(e.program_id, 0) + e.hbm_write_bytes
    assert set(written) == {(0,), (1,)} and written[(0,)] == written[(1,)] > 0


@pytest.mark.parametrize("appended", [[300, 90, 7], [512], [129, 1, 128, 130]], ids=str)
def test_lnc2_cores_take_a_fused_caches_tiles_in_turns(rng, appended):
    """Four tiles or more of a fused cache on LNC=2: each core writes its own tiles (p, p + 2,
    ...), K and V paired in one DMA a tile, as the reference append; fewer tiles (above) keep K
    on one core and V on the other."""
    from nki_kernels.paged_kv_append import append_paged_kv_cache_ref
    args = make_append_case(rng, [a + 40 for a in appended], appended, 16, 2, 8)
    expected = append_paged_kv_cache_ref(*args)
    with simulate.use_target("trn2"):
        append_paged_kv_cache(*args, lnc=2)
        trace = simulate.last_trace()
    np.testing.assert_array_equal(args[4], expected)
    writes = {}                        # the cache writes: [n, 2 (K, V), row] when paired
    for e in trace.events:
        if e.op == "dma_copy" and e.hbm_write_bytes and len(e.operands[0].shape) == 3:
            writes.setdefault(e.program_id, []).append(e.operands[0].shape)
    tiles = -(-sum(appended) // 128)
    bucket = 1 << (tiles - 1).bit_length()
    assert {p: len(w) for p, w in writes.items()} == {(0,): bucket // 2, (1,): bucket // 2}
    for shapes in writes.values():
        assert all(shape[1] == 2 for shape in shapes)          # K and V rows paired


def test_lnc2_is_refused_on_trn1_and_lnc3_everywhere(rng):
    args = make_append_case(rng, [9], [2], 16, 2, 8)
    before = args[4].copy()
    with simulate.use_target("trn1"), pytest.raises(ValueError, match="lnc=2 needs a NeuronCore-v3"):
        append_paged_kv_cache(*args, lnc=2)
    with pytest.raises(ValueError, match="lnc=3 must be 1 or 2"):
        append_paged_kv_cache(*args, lnc=3)
    np.testing.assert_array_equal(args[4], before)


def test_units_per_iteration_divide_the_bucket():
    from nki_kernels.paged_kv_append.kernel import units_per_iteration
    assert [units_per_iteration(u, 3) for u in (1, 2, 8, 33, 37, 64, 48)] == [1, 2, 8, 11, 1, 32, 24]
    assert units_per_iteration(256, 2) == 64 and units_per_iteration(48, 2) == 48


@pytest.mark.parametrize("tokens", [1000, 1100])
def test_blocks_of_tiles_cover_every_real_token(rng, target, tokens):
    """Buckets of 9 (exact policy: blocks of 3 tiles) and 16 tiles (blocks of 8) on trn2, blocks
    of 64 tokens on trn1: every real token lands, nothing else is written, and the loop runs only
    the blocks holding real tokens."""
    from nki_kernels.buckets import BucketPolicy, set_bucket_policy
    for policy in (BucketPolicy(exact=True), None):
        old = set_bucket_policy(policy) if policy else None
        try:
            lens = [tokens - 7, 7]
            args = make_append_case(rng, lens, lens, 16, 2, 8)
            ref = append_paged_kv_cache_ref(*args)
            append_paged_kv_cache(*args)
        finally:
            if old is not None:
                set_bucket_policy(old)
        assert_bits_equal(args[4], ref)
        trace = simulate.last_trace()
        per = {"trn1": 64}.get(target)
        if per:
            assert [l["iterations"] for l in trace.loops] == [-(-tokens // per)]
