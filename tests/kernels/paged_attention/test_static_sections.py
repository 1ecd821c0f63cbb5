"""A static pass in sections (work.static_sections): each core's rows of the longest requests
take the pass's chunk count, its other rows fewer, one section's pipeline after the other's.
Checked on the host (the split, the rows, the cache-row columns) and in the kernel against the
reference and against the same step in one section."""

import numpy as np
import pytest

from nki_kernels import simulate
from nki_kernels.paged_attention import batch_decode, batch_decode_ref, batch_prefill
from nki_kernels.paged_attention import batch_prefill_ref, plan, work
from nki_kernels.paged_attention.work import (NullItems, query_blocks, section_pack,
                                              static_row_chunks, static_rows_of,
                                              static_sections, static_slot_rows, static_work)

from .conftest import make_decode_case, statics_spy


def _req(lens, P=16):
    lens = np.asarray(lens)
    indptr = np.concatenate([[0], np.cumsum(-(-lens // P))])
    return query_blocks(indptr, lens, np.ones_like(lens), 1, -1, True, P)


def test_a_spread_batch_splits_and_a_uniform_one_does_not():
    # nine requests of 2-12 chunks in a bucket of 16 rows: each core's two longest take 12
    # chunks, its next four 6 and its last two (empty rows) 1, two requests a tile
    spread = _req([1353, 659, 227, 1296, 1529, 417, 1041, 738, 505])
    assert static_sections(spread, 16, 2, 12, 4) == ((2, 12), (4, 6), (2, 1))
    # one long request among short ones, four rows a core: its empty row one chunk
    assert static_sections(_req([655, 223, 1400, 413, 734, 501]), 8, 2, 12, 4) == (
        (1, 12), (2, 6), (1, 1))
    assert static_sections(_req([600] * 8), 8, 1, 6, 4) == ()
    assert static_sections(_req([1000]), 1, 2, 4, 1) == ()     # a split bucket of one
    # a single core: its rows of the longest first
    assert static_sections(_req([1500, 100, 120, 90]), 4, 1, 12, 1) == ((1, 12), (3, 2))
    # one long request among short ones: an eighth of the rows take the pass's chunks
    assert static_sections(_req([4000] + [300] * 12), 16, 1, 32) == ((2, 32), (14, 4))
    # lengths spread evenly over 1-16 chunks: the shortest quarter takes a third of the chunks
    spread32 = [16, 15, 15, 14, 14, 14, 14, 14, 13, 12, 12, 11, 11, 11, 11, 10, 10, 10, 9, 9, 9,
                7, 6, 5, 5, 4, 4, 2, 2, 2, 1, 1]
    assert static_sections(_req([128 * c - 5 for c in spread32]), 32, 1, 16) == (
        (24, 16), (8, 6))
    # six requests in eight rows, twelve in sixteen: the empty rows one chunk
    assert static_sections(_req([4000, 3800, 3000, 2900, 2000, 1900]), 8, 1, 32) == (
        (4, 32), (2, 16), (2, 1))
    assert static_sections(_req([700] * 12), 16, 1, 6) == ((12, 6), (4, 1))


def test_a_section_pack_divides_every_section():
    assert section_pack(4, (4, 4)) == 4
    assert section_pack(4, (2, 6)) == 2
    assert section_pack(4, (1, 3)) == 1
    assert section_pack(4, (4, 2, 2)) == 2


def test_the_longest_requests_take_the_first_rows_of_each_core():
    chunks = [11, 6, 2, 11, 12, 4, 9, 6, 4]
    req = _req([c * 128 for c in chunks])
    sections = ((4, 12), (4, 2))
    rows = static_rows_of(req, 16, 2, sections)
    counts = static_row_chunks(16, 2, 12, sections)
    assert list(counts) == [12] * 4 + [2] * 4 + [12] * 4 + [2] * 4
    assert len(set(rows)) == len(rows)
    first = [b for b in range(9) if counts[rows[b]] == 12]
    assert sorted(first) == sorted(np.argsort(-np.array(chunks), kind="stable")[:8])
    assert (np.array(chunks) <= counts[rows]).all()
    # dealt so the cores' first sections hold alike chunk totals
    load = [sum(chunks[b] for b in first if rows[b] // 8 == p) for p in (0, 1)]
    assert abs(load[0] - load[1]) <= 1
    table = static_work(req, 16, 16, 12, NullItems(slot=500, out=16), 2, rows, sections).items
    assert list(table[:, work.C1] - table[:, work.C0]) == list(counts)
    with pytest.raises(AssertionError, match="fewer chunk slots"):
        static_work(req, 16, 16, 12, NullItems(slot=500, out=16), 2, np.arange(9), sections)


def test_cache_rows_of_sections_are_each_rows_slots_back_to_back(rng):
    req = _req([300, 1000, 40, 700])
    table = static_work(req, 16, 4, 8, NullItems(slot=90, out=4), 1,
                        sections=((2, 8), (2, 4))).items
    pages = rng.permutation(120).astype(np.int32)[:, None]
    counts = table[:, work.C1] - table[:, work.C0]
    got = static_slot_rows(table, pages, 16, 2, 1, counts, True)
    alone = [static_slot_rows(table[r:r + 1], pages, 16, 2, 1, int(counts[r]), True)
             for r in range(4)]
    np.testing.assert_array_equal(got, np.concatenate(alone, axis=1))
    assert got.shape == (128, int(counts.sum()))


@pytest.mark.parametrize("lens, lnc, G", [
    ([1353, 659, 227, 1296, 1529, 417, 1041, 738, 505], 2, 4),
    ([1353, 659, 227, 1296, 1529, 417, 1041, 738, 505], 1, 4),
    ([655, 223, 1400, 413, 734, 501], 2, 4),
    ([3900, 120, 300, 90, 200, 450, 60, 330], 1, 4),        # one long among short ones
    ([3900, 120, 300, 90, 200, 450, 60, 330], 2, 4),
    ([1100, 100, 129, 0, 97], 1, 2)], ids=str)
def test_sections_match_the_reference_and_the_one_section_pass(rng, monkeypatch, lens, lnc, G):
    """Llama-3-8B's 8 kv heads (four requests a tile, or two when a section's rows ask), a
    request of no keys, lengths inside a page and past a chunk boundary, fp32 throughout. The
    last case runs looped in one section (one long request among short ones)."""
    args = make_decode_case(rng, lens, 16, 8, G, 128)
    seen = statics_spy(monkeypatch, plan.STATIC_PASS)
    with simulate.use_target("trn2"):
        out, lse = batch_decode(*args, return_lse=True, lnc=lnc)
        trace = simulate.last_trace()
        monkeypatch.setattr(work, "STATIC_MAX_SECTIONS", 1)
        one, one_lse = batch_decode(*args, return_lse=True, lnc=lnc)
        single = simulate.last_trace()
    assert len(seen[0]) == 3 and len(seen[1]) in (0, 2)     # sections, then one (or loops)
    assert not trace.loops
    ref, ref_lse = batch_decode_ref(*args, return_lse=True)
    np.testing.assert_allclose(out, ref, rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(lse, ref_lse, rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(out, one, rtol=1e-6, atol=1e-6)
    if not single.loops:                                    # fewer slots, fewer instructions
        assert len(trace) < len(single)


def test_a_mixed_steps_decode_part_runs_in_sections(rng, monkeypatch):
    """batch_prefill's decode launch (its one-query requests) takes sections too."""
    from .test_serving_shape import FixedCache
    cache = FixedCache(rng, pages=400)
    lens = [700, 1400, 130, 300, 650, 90]
    q_lens = [64, 1, 1, 1, 1, 1]
    q, kv, indptr, indices, last = cache.step(lens)[:5]
    Q = sum(q_lens)
    H, G, D = kv.shape[-2], q.shape[1] // kv.shape[-2], q.shape[2]
    qs = rng.standard_normal((Q, H * G, D)).astype(q.dtype)
    qo = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    seen = statics_spy(monkeypatch, plan.STATIC_PASS)
    with simulate.use_target("trn2"):
        out = batch_prefill(qs, kv, qo, indptr, indices, last, causal=True)
    assert any(len(s) == 3 for s in seen)
    ref = batch_prefill_ref(qs, kv, qo, indptr, indices, last, causal=True)
    np.testing.assert_allclose(out, ref, rtol=2e-5, atol=2e-5)


def test_the_cut_points_weighed_find_the_best_of_all_splits(monkeypatch):
    """``NKI_KERNELS_STATIC_SECTIONS=any``: ``work._section_cuts`` weighs only the rows where a
    smaller chunk count can start (and those rounded to whole packed tiles): over random batches
    the least cost it finds is every split's least (the exhaustive search took 160 ms for a bucket of 128 rows)."""
    import itertools
    fast = work._section_cuts

    def every(longest, rows, cores, chunks, pack):
        out = []
        for k in range(1, work.STATIC_MAX_SECTIONS):
            out.extend(itertools.combinations(range(1, rows), k))
        return out
    monkeypatch.setenv("NKI_KERNELS_STATIC_SECTIONS", "any")
    rng = np.random.default_rng(3)
    for _ in range(120):
        cores, rows = int(rng.integers(1, 3)), int(rng.choice([4, 8, 16, 32]))
        req = _req(rng.integers(1, 2000, int(rng.integers(1, rows + 1))))
        chunks = work.static_chunk_count(int((req.c1 - req.c0).max()))
        pack = int(rng.choice([1, 2, 4]))
        if chunks > work.STATIC_MAX_CHUNKS or work.static_core_rows(rows, cores) % pack:
            continue
        found = work._static_sections(req, rows, cores, chunks, pack)[0]
        monkeypatch.setattr(work, "_section_cuts", every)
        best = work._static_sections(req, rows, cores, chunks, pack)[0]
        monkeypatch.setattr(work, "_section_cuts", fast)
        assert found == pytest.approx(best)


def test_the_environment_caps_the_sections_or_weighs_any_split(monkeypatch):
    """``NKI_KERNELS_STATIC_SECTIONS``: 1 keeps one section (the fewest compiles), a number caps
    the menu's sections, ``any`` weighs every split; a bad value names the rule."""
    spread = _req([1353, 659, 227, 1296, 1529, 417, 1041, 738, 505])
    long_short = _req([4000, 120, 300, 90, 200, 450, 60, 330, 700, 1000])
    monkeypatch.setenv("NKI_KERNELS_STATIC_SECTIONS", "1")
    assert static_sections(spread, 16, 2, 12, 4) == ()
    monkeypatch.setenv("NKI_KERNELS_STATIC_SECTIONS", "2")
    assert static_sections(spread, 16, 2, 12, 4) == ((4, 12), (4, 3))
    assert all(len(m) == 2 or len(m[2]) == 2 for m in work.static_pass_menu(16, 1, 12))
    monkeypatch.delenv("NKI_KERNELS_STATIC_SECTIONS")
    menu = static_sections(long_short, 16, 1, 32)
    assert menu == ((4, 32), (8, 16), (4, 1)) and menu in _menu_sections(16, 1, 32)
    monkeypatch.setenv("NKI_KERNELS_STATIC_SECTIONS", "any")
    assert static_sections(long_short, 16, 1, 32) == ((1, 32), (6, 8), (9, 1))
    assert static_sections(spread, 16, 2, 12, 4) == ((2, 12), (2, 6), (4, 2))
    monkeypatch.setenv("NKI_KERNELS_STATIC_SECTIONS", "0")
    with pytest.raises(ValueError, match="NKI_KERNELS_STATIC_SECTIONS='0' must be 'any' or a"):
        static_sections(spread, 16, 2, 12, 4)


def _menu_sections(rows, cores, chunks):
    return {tuple((n, c) for n, c, _ in m[2]) for m in work.static_pass_menu(rows, cores, chunks)
            if len(m) == 3}


def test_every_planned_static_pass_is_on_its_buckets_menu():
    """Over random decode steps (spread, long among short, empty rows; one and two cores) the
    static-pass argument planned is one of ``work.static_pass_menu``'s for its bucket and chunk
    count: the programs a bucket compiles are bounded whatever lengths arrive (one section or
    the first section's full slots 0 or all, times the templates' splits)."""
    from nki_kernels.buckets import bucket
    rng = np.random.default_rng(5)
    H, G, D, P = 2, 4, 32, 16
    cache = np.zeros((4000, 2, P, H, D), np.float32)
    menus, programs = {}, set()
    for step in range(160):
        B = int(rng.integers(1, 20))
        lens = rng.integers(1, [4000, 900, 300][step % 3], B)
        if step % 4 == 0:
            lens[0] = 3000 + step
        pages = -(-lens // P)
        indptr = np.concatenate([[0], np.cumsum(pages)]).astype(np.int32)
        last = (lens - (pages - 1) * P).astype(np.int32)
        indices = rng.permutation(4000)[:indptr[-1]].astype(np.int32)
        q = np.zeros((B, H * G, D), np.float32)
        cores = 1 + step % 2
        with simulate.use_target("trn2"):
            launch = plan.prepare_decode(q, cache, indptr, indices, last, "NHD", None, 0.0, -1,
                                         None, 1.0, 1.0, cores)
        static = launch.statics[plan.STATIC_PASS]
        if not static:
            continue
        key = (bucket(B), cores, static[0])
        menus.setdefault(key, work.static_pass_menu(*key))
        assert static in menus[key], (lens, cores, static)
        programs.add(key + (static,))
    assert len(menus) > 20 and len(programs) > len(menus)       # the steps met many buckets
    assert max(len(m) for m in menus.values()) <= 32    # 2 in one section, 2 a split
