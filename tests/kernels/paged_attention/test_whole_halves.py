"""Two cores share a launch's whole units by each unit's loop iterations as well as its chunks
(``work.whole_unit_loops`` into ``work._whole_halves``): prompt chunks over unlike prefixes
differ less in their chunks than in the loops their tails and the group's rounds leave them,
and the sharing by kinds of item put the loop-heavy units on one core. Checked: each unit's
loop iterations for fixed bounds, the sharing the weights choose against the old one, the
candidates past the exhaustive search, and the kernel on LNC=2 against the reference with the
cores' loop barriers even."""

import numpy as np
import pytest

from nki_kernels import simulate
from nki_kernels.paged_attention import work
from nki_kernels.profile.cost_model import estimate

from .test_prefill import check, make_prefill_case

# Twelve prompt chunks of 64 queries over unlike prefixes (page 16, chunks of 128 keys): the
# chunked replay's shape whose cores had 6 and 2 loop barriers under the old sharing.
KV_LENS = [1250, 1200, 1190, 1180, 1170, 1100, 1000, 960, 850, 700, 480, 330]


def _units(kv_lens=KV_LENS, q_len=64, page_size=16):
    kv = np.asarray(kv_lens)
    pages = -(-kv // page_size)
    indptr = np.concatenate([[0], np.cumsum(pages)])
    return work.query_blocks(indptr, kv, np.full(kv.size, q_len), q_len, -1, True, page_size)


def test_each_units_loop_iterations():
    """Causal units: chunks [0, C1), the last masked. Without tails a unit of 10 chunks runs a
    block of 8, then its ninth chunk paired with the masked tenth (2 iterations); of 8 chunks
    blocks of 4 and 2, then a pair (3). With tails of four slots and rounds, 10 chunks leave 6
    before the tail: one round of four and two of one, a quarter of an iteration each."""
    req = _units()
    assert req.c1.tolist() == [10, 10, 10, 10, 10, 9, 8, 8, 7, 6, 4, 3]
    plain = work.whole_unit_loops(req, 0, False)
    assert plain.tolist() == [2, 2, 2, 2, 2, 2, 3, 3, 3, 2, 2, 2]
    tailed = work.whole_unit_loops(req, 4, True)
    np.testing.assert_allclose(tailed[:6], [0.75, 0.75, 0.75, 0.75, 0.75, 0.5])
    assert tailed[10] == 0.0                     # four chunks: all in the tail
    # without rounds: a block of 8, then the tail from chunk 8 with two slots empty
    assert work.whole_unit_loops(req, 4, False)[0] == pytest.approx(1 + 2 * work.UNIT_TAIL_EMPTY_SLOT)


def _slower(ones, weight, per, group_units=4):
    """The slower core's load of sharing ``ones``: its units' weights plus ``per`` for each of
    its iterations over units (``group_iterations`` of ``group_units``)."""
    count = int(ones.sum())
    sides = [(1 - ones) @ weight + per * work.group_iterations(np.array([ones.size - count]),
                                                                group_units)[0],
             ones @ weight + per * work.group_iterations(np.array([count]), group_units)[0]]
    return max(sides)


def test_two_cores_weigh_each_units_loops():
    """The old sharing (by kinds of item) cut the twelve units after the sixth: 59 chunks
    against 36. Weighing each unit's loops, no cut is best and the slower core's modelled
    load drops below the cut's by the same weights."""
    req = _units()
    chunks = (req.c1 - req.c0).astype(np.int64)
    kinds = work._unit_items(req)[1]
    loops = work.whole_unit_loops(req, 4, True)
    old, _ = work._whole_halves(chunks, kinds, 1, False, 4, 16, 4)
    assert old.tolist() == [0] * 6 + [1] * 6
    new, loads = work._whole_halves(chunks, kinds, 1, False, 4, 16, 4, loops)
    weight = chunks + work.UNIT_LOOP_TILE_CHUNKS / 16 * loops
    per = work.WHOLE_ITERATION_TILE_CHUNKS / 16
    assert max(loads) == pytest.approx(_slower(new, weight, per))
    assert _slower(new, weight, per) < _slower(old, weight, per) - 1.0
    assert (np.diff(new) != 0).sum() > 1         # not a cut in the units' order
    assert abs(int(new @ chunks) - int((1 - new) @ chunks)) <= 6


def test_many_units_take_turns_by_their_weight(monkeypatch):
    """Past the exhaustive search the candidates are the cuts, the greedy sharing and the
    units in turns, each by the weights: like pairs of units split between the cores."""
    monkeypatch.setattr(work, "WHOLE_HALVES_SEARCH_UNITS", 4)
    chunks = np.array([6, 6, 6, 6, 2, 2, 2, 2])
    loops = np.array([3.0, 3.0, 3.0, 3.0, 0.0, 0.0, 0.0, 0.0])
    kinds = np.zeros((8, len(work.ITEM_CLASSES)), np.int64)
    ones, loads = work._whole_halves(chunks, kinds, 1, False, 4, 16, 0, loops)
    assert ones[:4].sum() == 2 and ones[4:].sum() == 2
    assert loads[0] == pytest.approx(loads[1])


@pytest.mark.parametrize("chunks, expect", [
    ([8, 11, 2, 1], [1, 0, 0, 1]),              # in turns: 11 + 2 and 8 + 1, two units each
    ([3, 5, 8, 7, 1, 1], [0, 1, 0, 1, 0, 0]),    # greedy: 13 on four units, 12 on two
])
def test_each_candidate_past_the_search_can_win(monkeypatch, chunks, expect):
    """Units weighed by chunks alone (no loops): no cut does as well as the turns in the
    first case, nor as the greedy sharing in the second (a core's iterations over units
    priced at WHOLE_ITERATION_TILE_CHUNKS / 16 chunks each)."""
    monkeypatch.setattr(work, "WHOLE_HALVES_SEARCH_UNITS", 2)
    chunks = np.array(chunks)
    kinds = np.zeros((chunks.size, len(work.ITEM_CLASSES)), np.int64)
    ones, loads = work._whole_halves(chunks, kinds, 1, False, 4, 16, 0, np.zeros(chunks.size))
    assert ones.tolist() == expect
    per = work.WHOLE_ITERATION_TILE_CHUNKS / 16
    for k in range(1, chunks.size):             # every cut's slower core is slower
        cut = (np.arange(chunks.size) >= k).astype(np.int64)
        assert _slower(cut, chunks, per) > max(loads)


@pytest.mark.sim_only
def test_two_cores_balance_their_loop_barriers(rng, monkeypatch):
    """The twelve units on LNC=2 (small heads): every output the reference's, and the cores'
    loop barriers (cost model) 4 and 4, where the old sharing gave 6 and 2 (tails of four
    slots, as the sharing's loads count them)."""
    monkeypatch.setenv("NKI_KERNELS_TAIL_SLOTS", "4")
    args = make_prefill_case(rng, [64] * 12, KV_LENS, 16, 2, 4, 32)
    with simulate.use_target("trn2"), simulate.tracing() as traces:
        check(args, causal=True, lnc=2)
    barriers = estimate(traces[-1], "trn2").schedule.barriers
    assert max(barriers.values()) - min(barriers.values()) <= 1
    monkeypatch.setattr(work, "whole_unit_loops", lambda *a: None)
    with simulate.use_target("trn2"), simulate.tracing() as traces:
        check(args, causal=True, lnc=2)
    old = estimate(traces[-1], "trn2").schedule.barriers
    assert max(old.values()) > max(barriers.values())
