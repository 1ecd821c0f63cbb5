"""benchmarks/decode_sections.py: its steps and the serving loop's program count per mode;
benchmarks/section_fit.py: the splits it models."""

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



def test_the_fit_models_every_split_of_the_menu_one_section_first():
    from nki_kernels.paged_attention import work
    fit = load("section_fit")
    options = fit.splits([4000, 300, 250, 700, 90, 1200], 8, 1, 32, 4)
    assert options[0] == ((8,), (32,))
    assert all(sum(sizes) == 8 and list(counts) == sorted(counts, reverse=True)
               for sizes, counts in options)
    menu = {m[2] for m in work.static_pass_menu(8, 1, 32) if len(m) == 3}
    assert all(work.section_parts(tuple(zip(s, c)), 0) in menu for s, c in options[1:])
    assert len(options) > 3
