"""Whole units (chunked prefill) end in a tail of up to ``work.UNIT_TAIL_CHUNKS`` chunk slots
folded without a loop, as many as the host chose for the launch (``work.unit_tail_slots``):
the host moves the unit's last chunks into it (``work.with_unit_tail``), the kernel gathers them
from one page-id DMA with one mask predicate per tile of query tokens
(``kernel_items.unit_tail_block``), in causal launches. Checked: the rows' chunk ranges, the
choice of the tail's start and size, and the kernel against the reference over tails of one to
eight slots, windows, sinks, a soft cap, a unit split between two cores, and the paths without
a tail (trn1, custom masks). Also here: whole units grouped in a loop iteration (their tails
folded as one pipeline), and the accumulators rescaled on GpSimd."""

import numpy as np
import pytest

from nki_kernels import simulate
from nki_kernels.paged_attention.work import (C0, C1, FULL_HI, FULL_LO, LEN, META_COLS,
                                              UNIT_TAIL_CHUNKS, UNIT_TAIL_EMPTY_SLOT,
                                              _unit_loop_cost, unit_tail_chunks, unit_tail_cost,
                                              unit_tail_slots, with_unit_tail)

from .conftest import statics_spy
from .test_prefill import check, make_prefill_case

S = UNIT_TAIL_CHUNKS


def _row(c0, lo, hi, c1, length):
    row = np.zeros(META_COLS, np.int64)
    row[C0], row[FULL_LO], row[FULL_HI], row[C1], row[LEN] = c0, lo, hi, c1, length
    return row


@pytest.mark.parametrize("c0, lo, hi, c1", [(0, 0, 0, 1), (0, 0, 6, 8), (0, 0, 8, 9),
                                            (0, 0, 14, 16), (3, 5, 20, 22), (0, 0, 0, 0),
                                            (2, 2, 2, 3)])
def test_the_tail_takes_the_units_last_chunks(c0, lo, hi, c1):
    """The loops' chunks [C0, C1') and the tail's [C1', C1' + S) cover [c0, c1) once: the tail
    holds every masked chunk at the end, the window-start and mask-free ranges end by C1'."""
    row = with_unit_tail(_row(c0, lo, hi, c1, c1 * 128), S, 16)
    ts = int(row[C1])
    assert max(c0, c1 - S) <= ts <= c1 and ts <= max(c0, hi)
    assert c0 <= row[FULL_LO] <= row[FULL_HI] <= ts
    assert row[FULL_LO] == min(lo, ts) and row[FULL_HI] == max(min(lo, ts), min(hi, ts))
    assert row[LEN] == c1 * 128


def test_the_tail_start_saves_loop_iterations():
    """1000 keys behind a 128-token chunk (six mask-free chunks, two masked): the tail takes two
    mask-free chunks and both masked ones, the loops one block of four (one iteration, not
    three); 1152 keys (eight mask-free, one masked): the block of eight stays whole."""
    row = with_unit_tail(_row(0, 0, 6, 8, 1000), 4, 16)
    assert row[C1] == 4 and _unit_loop_cost(0, 0, 6, 8) == 3 and _unit_loop_cost(0, 0, 4, 4) == 1
    assert with_unit_tail(_row(0, 0, 8, 9, 1152), 4, 16)[C1] == 8


def test_a_split_parts_keys_end_at_its_chunks():
    """The first part of a unit split between the cores ([0, 5) of a request of 1000 keys): its
    tail's slots past chunk 5 belong to the other core, so LEN ends at the part's last chunk."""
    row = with_unit_tail(_row(0, 0, 5, 5, 1000), 4, 16)
    assert row[LEN] == 5 * 128 and row[C1] >= 1
    assert with_unit_tail(_row(0, 0, 5, 5, 1000), 0, 16)[LEN] == 1000


def test_when_units_have_tails():
    assert unit_tail_chunks(3, 16, 1000, False) == S
    assert unit_tail_chunks(2, 16, 1000, False) == 0             # trn1: no indirect gathers
    assert unit_tail_chunks(3, 256, 1000, False) == 0            # pages over 128 tokens
    assert unit_tail_chunks(3, 16, 1 << 24, False) == 0          # rows past fp32's integers
    assert unit_tail_chunks(3, 16, 1000, True) == 0              # a custom mask's table


def test_a_launch_tail_costs_least_over_its_units():
    """Slots: the power of two whose loop iterations and empty slots sum least over the units
    ((C0, FULL_LO, FULL_HI, C1) each), at most the limit, none without tails."""
    first_chunks = [(0, 0, 0, 1)] * 3                     # a prompt's first chunk each
    assert unit_tail_slots(8, first_chunks) == 1
    assert unit_tail_slots(8, [(0, 0, 0, 2), (0, 0, 0, 1)]) == 2
    assert unit_tail_slots(8, [(0, 0, 8, 10)]) == 2       # loops take the mask-free 8
    assert unit_tail_slots(8, [(0, 0, 4, 6)] * 2) == 8    # no loop, two empty slots each
    assert unit_tail_slots(4, [(0, 0, 4, 6)] * 2) == 2    # a loop either way: fewer slots
    assert unit_tail_slots(8, [(0, 0, 32, 36)]) == 4      # a block of 32 then the tail
    # chunks of 256 over 256-1500 keys: eight slots save loops but for the slots' own price
    # (cost model: 651 us with four, 689 with eight)
    assert unit_tail_slots(8, [(0, 0, 0, 2), (0, 0, 3, 6), (0, 0, 6, 9), (0, 0, 9, 12)]) == 4
    assert unit_tail_slots(0, first_chunks) == 0          # no tails on this path
    assert unit_tail_slots(8, []) == 1
    assert unit_tail_cost(0, 0, 32, 36, 8) == (1 + 4 * UNIT_TAIL_EMPTY_SLOT, 32)


def test_the_most_slots_fit_their_bytes():
    assert unit_tail_chunks(3, 16, 1000, False, 4096) == 8          # bf16 Llama: 4 KiB a chunk
    assert unit_tail_chunks(3, 16, 1000, False, 8192) == 4          # fp32: 8 KiB
    assert unit_tail_chunks(3, 16, 1000, False, 16384) == 0         # not even four


def _tail_sizes(monkeypatch):
    """The tail size (the kernel's static argument) of each launch from here on."""
    from nki_kernels.paged_attention import plan
    return statics_spy(monkeypatch, plan.UNIT_TAIL)


@pytest.mark.parametrize("kv_lens, slots", [([40, 64], 1), ([128, 129], 2), ([300, 40], 3),
                                            ([700, 40], 2), ([700, 680], 8)], ids=str)
def test_the_kernel_folds_the_tail_the_host_chose(rng, monkeypatch, kv_lens, slots):
    """The kernel's static tail size is the host's choice for the launch
    (``unit_tail_slots``); the result matches the reference whatever it is."""
    monkeypatch.setenv("NKI_KERNELS_TAIL_SLOTS", "launch")
    seen = _tail_sizes(monkeypatch)
    args = make_prefill_case(rng, [40, 33], kv_lens, 16, 2, 4, 32)
    with simulate.use_target("trn2"):
        check(args, causal=True)
        assert _tail_gathers() > 0
    assert seen == [slots]


@pytest.mark.parametrize("pinned", ["4", "1", "8"])
def test_a_pinned_tail_size_serves_every_launch(rng, monkeypatch, pinned):
    """NKI_KERNELS_TAIL_SLOTS pins the size (one compile per bucket), at most the shape's."""
    seen = _tail_sizes(monkeypatch)
    monkeypatch.setenv("NKI_KERNELS_TAIL_SLOTS", pinned)
    for kv_lens in ([40, 64], [700, 680]):
        args = make_prefill_case(rng, [40, 33], kv_lens, 16, 2, 4, 32)
        with simulate.use_target("trn2"):
            check(args, causal=True)
    assert seen == [int(pinned)] * 2
    args = make_prefill_case(rng, [40], [500], 16, 8, 1, 128)      # fp32: 8 KiB a chunk
    with simulate.use_target("trn2"):
        check(args, causal=True)
    assert seen[-1] == min(int(pinned), 4)


def test_the_default_tail_is_two_three_four_or_eight_slots(rng, monkeypatch):
    """Unset, a launch takes two, three, four or eight slots, whichever its units favour (a
    bucket compiles once per size it meets): prompts' first chunks two (one slot only when
    set), units of three chunks three, long prefixes eight, with several units a core and with
    one."""
    seen = _tail_sizes(monkeypatch)
    monkeypatch.delenv("NKI_KERNELS_TAIL_SLOTS", raising=False)
    for kv_lens in ([40, 64], [700, 680], [300, 290]):
        args = make_prefill_case(rng, [40, 33], kv_lens, 16, 2, 4, 32)
        with simulate.use_target("trn2"):
            check(args, causal=True)
    assert seen == [2, 8, 3]
    for kv_lens in ([64], [700]):
        args = make_prefill_case(rng, [40], kv_lens, 16, 2, 4, 32)
        with simulate.use_target("trn2"):
            check(args, causal=True)
    assert seen[3:] == [2, 8]


def test_a_list_of_tail_sizes_bounds_the_choice(rng, monkeypatch):
    """NKI_KERNELS_TAIL_SLOTS="1,2" lets each launch choose between those two only."""
    seen = _tail_sizes(monkeypatch)
    monkeypatch.setenv("NKI_KERNELS_TAIL_SLOTS", "1,2")
    for kv_lens in ([40, 64], [700, 680]):
        args = make_prefill_case(rng, [40, 33], kv_lens, 16, 2, 4, 32)
        with simulate.use_target("trn2"):
            check(args, causal=True)
    assert seen == [1, 2]


@pytest.mark.parametrize("text", ["6", "4,5", "four"])
def test_a_bad_pinned_tail_size_is_refused(rng, monkeypatch, text):
    monkeypatch.setenv("NKI_KERNELS_TAIL_SLOTS", text)
    args = make_prefill_case(rng, [40], [40], 16, 2, 4, 32)
    with pytest.raises(ValueError, match="NKI_KERNELS_TAIL_SLOTS=.* must be 'launch' or sizes"):
        with simulate.use_target("trn2"):
            check(args, causal=True)


def _tail_gathers():
    """Page-id DMAs of unit tails in the last launch."""
    return sum(1 for e in simulate.last_trace() if e.op == "dma_copy"
               and any(o.tensor == "tail_pages" for o in e.operands))


# kv lengths behind chunks of 40 queries (page 16): tails of 1..4 real chunks, masked chunks at
# a chunk edge and straddling one, units of one chunk (the first chunk of a prompt)
CASES = [([40], [40]), ([40, 40], [128, 129]), ([40], [300]), ([40, 33], [1000, 520]),
         ([40, 40, 40], [1152, 700, 64]), ([100], [2100])]


@pytest.mark.parametrize("lnc", [1, 2])
@pytest.mark.parametrize("q_lens, kv_lens", CASES, ids=str)
def test_unit_tails_match_the_reference(rng, q_lens, kv_lens, lnc):
    args = make_prefill_case(rng, q_lens, kv_lens, 16, 2, 4, 32)
    with simulate.use_target("trn2"):
        check(args, lnc=lnc, causal=True)
        assert _tail_gathers() > 0
        check(args, lnc=lnc, causal=True, window_left=150)


@pytest.mark.parametrize("options", [dict(sinks=np.linspace(-1, 2, 8).astype(np.float32)),
                                     dict(logits_soft_cap=5.0), dict(causal=False)], ids=str)
def test_unit_tails_with_sinks_soft_cap_and_no_causal_mask(rng, options):
    args = make_prefill_case(rng, [40, 70], [500, 140], 16, 2, 4, 32)
    with simulate.use_target("trn2"):
        check(args, **options)


@pytest.mark.parametrize("kv", [200, 300, 450, 700, 1000])
def test_a_split_unit_counts_each_key_once(rng, monkeypatch, kv):
    """One unit split between two cores (a bucket of one unit): the first core's part ends
    inside the keys, its tail's slots past the cut (the other core's keys) read nothing."""
    from nki_kernels.buckets import BucketPolicy, set_bucket_policy
    from nki_kernels.paged_attention import plan
    spans = []
    split_work = plan.split_work

    def spy(*args, **kwargs):
        work = split_work(*args, **kwargs)
        spans.append(work.spans)
        return work
    monkeypatch.setattr(plan, "split_work", spy)
    old = set_bucket_policy(BucketPolicy(1, 2))
    try:
        args = make_prefill_case(rng, [30], [kv], 16, 2, 4, 32)
        with simulate.use_target("trn2"):
            check(args, lnc=2, causal=True)
            check(args, lnc=2, causal=False)
    finally:
        set_bucket_policy(old)
    assert all(s.shape[0] == 2 and s[:, 3].all() for s in spans)     # a split unit each time


@pytest.mark.parametrize("page_size", [4, 32, 128])
def test_unit_tails_over_page_sizes(rng, page_size):
    args = make_prefill_case(rng, [40, 50], [700, 260], page_size, 1, 8, 32)
    with simulate.use_target("trn2"):
        check(args, causal=True, window_left=300)


def test_no_tail_on_trn1_with_a_custom_mask_or_without_a_causal_mask(rng):
    """A tail for causal launches only (whose units all end in masked chunks): a mask-free
    unit's tail would be empty slots (a cascade's shared level)."""
    args = make_prefill_case(rng, [40], [300], 16, 2, 4, 32)
    with simulate.use_target("trn1"):
        check(args, causal=True)
        assert _tail_gathers() == 0
    mask = rng.random(40 * 300) < 0.6
    with simulate.use_target("trn2"):
        check(args, custom_mask=mask)
        assert _tail_gathers() == 0
        check(args, causal=False)
        assert _tail_gathers() == 0
        check(args, causal=True)
        assert _tail_gathers() > 0


def test_keys_before_a_window_in_the_tail_are_not_read(rng):
    """A NaN K/V row before the window's start, in the tail's chunks, never reaches the output:
    the tail drops those tokens from its gathers (docs/numerics.md)."""
    args = make_prefill_case(rng, [40], [300], 16, 2, 4, 32)
    cache, kv_indptr, kv_indices = args[1], args[3], args[4]
    for pos in (100, 150, 199):
        cache[kv_indices[kv_indptr[0] + pos // 16], :, pos % 16] = np.nan
    with simulate.use_target("trn2"):
        out, _ = check(args, causal=True, window_left=60)
        assert _tail_gathers() > 0
    assert np.isfinite(out).all()


def _gpsimd_rescales():
    return sum(1 for e in simulate.last_trace() if e.engine == "gpsimd"
               and e.op == "tensor_tensor" and any(o.tensor == "pv_sb" for o in e.operands))


def test_every_second_kv_heads_accumulator_rescales_on_gpsimd(rng):
    """Whole units of several query tiles a kv head (trn2): every second kv head's tiles rescale
    their accumulator on GpSimd, matching the reference; trn1 (VectorE and GpSimd share SBUF)
    and a unit of one query tile a kv head keep VectorE."""
    args = make_prefill_case(rng, [128], [700], 16, 4, 4, 32)
    with simulate.use_target("trn2"):
        check(args, causal=True)
        assert _gpsimd_rescales() > 0
        check(make_prefill_case(rng, [32], [700], 16, 4, 4, 32), causal=True)
        assert _gpsimd_rescales() == 0
    with simulate.use_target("trn1"):
        check(args, causal=True)
        assert _gpsimd_rescales() == 0


@pytest.mark.parametrize("q_lens, kv_lens", [
    ([20, 30], [40, 45]), ([40, 33, 50], [500, 90, 260]),
    ([30, 25, 32, 20, 31, 17, 28], [700, 900, 1300, 600, 300, 17, 500])], ids=str)
def test_units_grouped_in_an_iteration_keep_their_own_queries(rng, target, q_lens, kv_lens):
    """The unit loops take four units an iteration, then two, then one (each later unit's setup
    before the earlier ones' loops): each keeps its own query pads (tiles of two kv heads, which
    keep theirs between units)."""
    check(make_prefill_case(rng, q_lens, kv_lens, 8, 2, 2, 64), causal=True)
    check(make_prefill_case(rng, q_lens, kv_lens, 8, 2, 2, 64), causal=True, lnc=1,
          window_left=30)


@pytest.mark.parametrize("kv", [128, 640, 1000, 1152, 2048])
def test_the_hosts_loop_count_is_the_kernels(rng, kv):
    """A unit alone (a bucket of one: no loop over units): the loop iterations the kernel runs
    are the ones ``_unit_loop_cost`` counts for the chunks before its tail."""
    from nki_kernels.paged_attention import plan
    rows = []
    split_work = plan.split_work

    def spy(*args, **kwargs):
        work = split_work(*args, **kwargs)
        rows.append(work.items[0].copy())
        return work
    args = make_prefill_case(rng, [32], [kv], 16, 2, 4, 32)
    mp = pytest.MonkeyPatch()
    mp.setattr(plan, "split_work", spy)
    try:
        with simulate.use_target("trn2"):
            check(args, causal=True)
            iterations = sum(loop["iterations"] for loop in simulate.last_trace().loops)
    finally:
        mp.undo()
    row = rows[-1]
    assert iterations == _unit_loop_cost(int(row[C0]), int(row[FULL_LO]), int(row[FULL_HI]),
                                         int(row[C1]))
