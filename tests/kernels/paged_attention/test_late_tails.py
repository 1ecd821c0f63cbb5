"""Decode's late tails (work.LATE_TAILS): a request whose keys end inside a chunk, after three
whole chunks or more, folds its last four chunks as one masked TAIL item whose only zeroed V
slot is its last, when that leaves the slower core fewer loop iterations than single masked
chunks."""

import numpy as np
import pytest

from nki_kernels import simulate
from nki_kernels.paged_attention import batch_decode, batch_decode_ref, kernel_items, work
from nki_kernels.paged_attention.plan import prepare_decode
from nki_kernels.paged_attention.work import LATE_TAILS, MASKED_AGAIN, TAIL, class_items

from .conftest import assert_close, make_decode_case

BLOCK1, BLOCK2, BLOCK4, BLOCK8 = (work.ITEM_CLASSES.index((n, False)) for n in (1, 2, 4, 8))
FIRST = work.FIRST_MASKED


@pytest.mark.parametrize("full_lo, full_hi, a, e, items", [
    (0, 4, 0, 5, [(TAIL, 1, 5), (BLOCK1, 0, 1)]),          # 4 whole chunks, then a partial one
    (0, 3, 0, 4, [(TAIL, 0, 4)]),                          # 3 whole, then a partial one
    (0, 6, 0, 7, [(TAIL, 3, 7), (BLOCK2, 0, 2), (BLOCK1, 2, 3)]),
    (2, 7, 0, 8, [(TAIL, 4, 8), (MASKED_AGAIN, 0, 1), (MASKED_AGAIN, 1, 2),
                  (BLOCK2, 2, 4)]),                        # a window's start before them
    (1, 6, 0, 7, [(TAIL, 3, 7), (MASKED_AGAIN, 0, 1), (BLOCK2, 1, 3)]),
    (1, 5, 0, 6, [(TAIL, 2, 6), (MASKED_AGAIN, 0, 1), (BLOCK1, 1, 2)]),     # as many items
    (0, 2, 0, 3, [(FIRST, 2, 3), (BLOCK2, 0, 2)]),         # under four chunks: no tail
    (0, 8, 0, 8, [(BLOCK8, 0, 8)]),                        # whole chunks only: no tail
    (0, 8, 0, 9, [(FIRST, 8, 9), (BLOCK8, 0, 8)]),         # a tail would make three items
    (0, 5, 0, 7, [(FIRST, 5, 6), (MASKED_AGAIN, 6, 7), (BLOCK4, 0, 4), (BLOCK1, 4, 5)]),
])
def test_a_unit_ends_in_a_late_tail_only_when_it_saves_items(full_lo, full_hi, a, e, items):
    got = class_items(full_lo, full_hi, a, e, LATE_TAILS)
    assert sorted(got) == sorted(items)


def test_counts_match_the_items_and_every_chunk_is_folded_once():
    for lo in range(0, 5):
        for hi in range(lo, 40):
            for a in range(0, 6):
                for e in range(a, 42):
                    items = class_items(lo, hi, a, e, LATE_TAILS)
                    kinds = np.zeros(len(work.ITEM_CLASSES), np.int64)
                    for kind, _, _ in items:
                        kinds[kind] += 1
                    got = work._kind_counts(lo, hi, np.array(a), np.array(e), LATE_TAILS)
                    assert (got == kinds).all(), (lo, hi, a, e)
                    folded = sorted(c for _, x, y in items for c in range(x, y))
                    assert folded == list(range(a, e)), (lo, hi, a, e)


def _plan(lens, cores=1, page_size=16, target="trn2"):
    rng = np.random.default_rng(0)
    args = make_decode_case(rng, lens, page_size, 2, 2, 16)
    q, cache, indptr, indices, last, layout = args
    with simulate.use_target(target):
        return prepare_decode(q, cache, indptr, indices, last, layout, None, None, -1, None,
                              1.0, 1.0, cores)


def _tail_rows(launch):
    meta = launch.arrays[0]
    return int(((meta[:, work.C1] - meta[:, work.C0] == work.TAIL_CHUNKS)
                & (meta[:, work.FULL_HI] < meta[:, work.C1])).sum())


def test_late_tails_are_taken_when_they_cut_loop_iterations(monkeypatch):
    """Twelve requests of 500-620 keys (four or five chunks of 128) in device loops: single
    masked chunks and blocks of 1, 2 and 4 make four kinds of item; with late tails two.
    Requests of whole chunks have nothing to tail."""
    monkeypatch.setattr(work, "STATIC_MAX_SLOTS", 0)      # the device loops (no static pass)
    spread = [500, 510, 530, 560, 590, 600, 610, 620, 505, 515, 525, 615]
    for cores in (1, 2):
        assert _tail_rows(_plan(spread, cores)) > 0
    assert _tail_rows(_plan([1024] * 8)) == 0
    assert _tail_rows(_plan(spread, target="trn1")) == 0        # no indirect gathers


def test_equal_loop_iterations_keep_single_masked_chunks():
    """Where late tails leave the slower core as many loop iterations, their per-token gathers
    would only cost more: the plan keeps single masked chunks."""
    req = work._requests(np.array([0, 40, 80]), np.array([630, 640]), -1, 16)
    args = (req, 2, 1, 16, None, False, None)
    plain, late = work._split_plan(*args, False), work._split_plan(*args, LATE_TAILS)
    assert work._iterations(late) == work._iterations(plain)
    assert any(kind == TAIL for _, _, its in late.plan[0] for kind, _, _ in its)
    chosen = work.split_work(req, 16, 2, 1, 16, tails=LATE_TAILS)
    assert (chosen.items == work.split_work(req, 16, 2, 1, 16).items).all()


SPREAD = [500, 515, 530, 600, 610, 620, 505, 585, 389, 460, 511, 1000]


def test_a_launch_with_tails_compiles_as_one_without(monkeypatch):
    """Tails are rows of the item table: the kernel's static arguments do not change."""
    monkeypatch.setattr(work, "STATIC_MAX_SLOTS", 0)      # the device loops (no static pass)
    with_tails = _plan(SPREAD)
    without = _plan([1024] * 12)
    assert _tail_rows(with_tails) > 0 and _tail_rows(without) == 0
    assert with_tails.statics == without.statics


@pytest.mark.parametrize("lnc", [1, 2])
@pytest.mark.parametrize("page_size", [8, 16, 32])
@pytest.mark.parametrize("options", [{}, {"window_left": 700}, {"logits_soft_cap": 20.0},
                                     {"sinks": True}], ids=str)
def test_late_tails_match_the_reference(rng, monkeypatch, lnc, page_size, options):
    """Keys ending just past, inside and just before chunk boundaries (a chunk is 128 tokens),
    a window whose start comes before a tail (its first chunks masked, MASKED_AGAIN after the
    tail); the NaN-filled cache's unwritten slots would reach the output through any V slot a
    tail failed to zero. (The device loops: a static pass would take these steps.)"""
    monkeypatch.setattr(work, "STATIC_MAX_SLOTS", 0)
    lens = SPREAD if "window_left" not in options else [900 + 29 * k for k in range(12)]
    args = make_decode_case(rng, lens, page_size, 2, 4, 32)
    options = dict(options)
    if options.pop("sinks", False):
        options["sinks"] = rng.standard_normal(8).astype(np.float32)
    zeroed = []
    load_rows = kernel_items._load_rows

    def spy(st, row, zero_v=True, later=None):
        zeroed.append(zero_v)
        return load_rows(st, row, zero_v, later)
    with simulate.use_target("trn2"):
        mp = pytest.MonkeyPatch()
        mp.setattr(kernel_items, "_load_rows", spy)
        try:
            out, lse = batch_decode(*args, return_lse=True, lnc=lnc, **options)
        finally:
            mp.undo()
    ref, ref_lse = batch_decode_ref(*args, return_lse=True, **options)
    assert_close(out, ref, lse, ref_lse, dtype="float32")
    # each late tail gathers three whole chunks without zeroing their V, then its last
    assert zeroed.count(False) > 0 and zeroed.count(False) == 3 * zeroed.count(True)


def test_late_tails_in_bfloat16(rng, monkeypatch):
    import ml_dtypes
    monkeypatch.setattr(work, "STATIC_MAX_SLOTS", 0)      # the device loops (no static pass)
    lens = [500, 510, 530, 560, 590, 600, 610, 620, 505, 515, 525, 615]
    args = make_decode_case(rng, lens, 16, 8, 4, 128, q_dtype=ml_dtypes.bfloat16,
                            kv_dtype=ml_dtypes.bfloat16)
    for lnc in (1, 2):
        with simulate.use_target("trn2"):
            out, lse = batch_decode(*args, return_lse=True, lnc=lnc)
        ref, ref_lse = batch_decode_ref(*args, return_lse=True)
        assert_close(out, ref, lse, ref_lse, dtype="bfloat16")
