"""benchmarks/decode_sections.py: its steps and the serving loop's program count per mode."""

from .benchmark_scripts import load


def test_the_steps_are_the_documented_spread_and_long_among_short_batches():
    ds = load("decode_sections")
    steps = ds.batches()
    assert [k for k, _ in steps] == ["spread"] * 12 + ["long among short"] * 3
    assert all(3 <= len(lens) <= 40 and 50 <= min(lens) and max(lens) <= 4096
               for k, lens in steps if k == "spread")
    assert all(lens[0] == 4000 and max(lens[1:]) < 500 for k, lens in steps if k != "spread")
    assert steps == ds.batches()                       # one fixed draw


def test_one_section_plans_fewest_programs_and_any_split_most(monkeypatch):
    ds = load("decode_sections")
    counts = {}
    for value in ("1", None, "any"):
        if value is None:
            monkeypatch.delenv(ds.ENV, raising=False)
        else:
            monkeypatch.setenv(ds.ENV, value)
        counts[value] = ds.loop_programs(1, steps=40)
    assert counts["1"] < counts[None] < counts["any"]


def test_the_fits_proxy_picks_what_the_planner_picks():
    """benchmarks/section_fit.py weighs the menu's splits as ``work.static_sections`` does: at
    the current terms its least-cost split is the planner's, over random spread steps."""
    import numpy as np
    from nki_kernels.paged_attention import work
    fit = load("section_fit")
    rng = np.random.default_rng(11)
    checked = 0
    for _ in range(60):
        cores, rows = int(rng.integers(1, 3)), int(rng.choice([8, 16, 32]))
        lens = [int(x) for x in rng.integers(30, 3000, int(rng.integers(2, rows + 1)))]
        chunks = work.static_chunk_count(max(-(-n // 128) for n in lens))
        pack = int(rng.choice([1, 2, 4]))
        if chunks > work.STATIC_MAX_CHUNKS or work.static_core_rows(rows, cores) % pack:
            continue
        options = fit.splits(lens, rows, cores, chunks, pack)
        assert options[0] == ((work.static_core_rows(rows, cores),), (chunks,))
        sizes, counts = min(options, key=lambda o: (fit.proxy(
            o[0], o[1], pack, work.STATIC_ROW_COST_CHUNKS, work.SECTION_SLOT_SHARE,
            work.STATIC_SECTION_COST_CHUNKS), len(o[0])))
        page = 16
        L = np.asarray(lens)
        indptr = np.concatenate([[0], np.cumsum(-(-L // page))])
        req = work.query_blocks(indptr, L, np.ones_like(L), 1, -1, True, page)
        want = work.static_sections(req, rows, cores, chunks, pack)
        assert (() if len(sizes) == 1 else tuple(zip(sizes, counts))) == want
        checked += 1
    assert checked > 30
