"""Whole units (blocks of more than 16 queries) keep their tiles' softmax states in one bank:
grouped running maxima, rescales and row sums, finalized at once, with their output written one
query block at a time for all kv heads when each tile holds one kv head, P^T by DMA on trn2,
masked chunks folded two at a time. Checked against the reference over the tilings that take
each path: one kv head per tile (G 4), several per tile (G 1, 4 kv heads), tiles of unequal heads
(3 kv heads: no grouping), sinks and a soft cap (per-tile paths), a window (masked pairs at the
window's start), one and two cores."""

import numpy as np
import pytest

from nki_kernels import simulate
from nki_kernels.paged_attention.kernel_softmax import head_major
from nki_kernels.paged_attention.plan import query_block
from nki_kernels.paged_attention.work import whole_units

from .test_prefill import check, make_prefill_case

SHAPES = [  # q_lens, kv_lens, page size, kv heads, group, head dim
    ([40, 70], [300, 140], 16, 2, 4, 32),        # one kv head per tile: head-major writes
    ([40, 20], [300, 100], 16, 4, 1, 32),        # two kv heads per tile: the generic bank
    ([33, 5], [200, 37], 8, 3, 1, 64),           # tiles of 2 and 1 kv heads: no grouping
    ([300], [700], 16, 1, 2, 128),               # 8 query tiles of one kv head
]


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("options", [dict(), dict(window_left=150),
                                     dict(sinks=np.linspace(-1, 2, 16).astype(np.float32)),
                                     dict(logits_soft_cap=5.0)], ids=str)
def test_whole_units_match_the_reference(rng, target, shape, options):
    q_lens, kv_lens, P, H, G, D = shape
    assert whole_units(query_block(max(q_lens), G, H, D))
    if "sinks" in options:
        options = dict(sinks=options["sinks"][:H * G])
    check(make_prefill_case(rng, q_lens, kv_lens, P, H, G, D), **options)


@pytest.mark.parametrize("q_lens, kv_lens", [([300], [700]), ([200, 90, 300], [260, 90, 900])],
                         ids=str)
def test_whole_units_on_two_cores(rng, q_lens, kv_lens):
    """One unit (split between the cores and merged) and several (whole units per core)."""
    with simulate.use_target("trn2"):
        check(make_prefill_case(rng, q_lens, kv_lens, 16, 2, 4, 64), lnc=2)
        check(make_prefill_case(rng, q_lens, kv_lens, 16, 2, 4, 64), lnc=2, window_left=100)


def test_bf16_whole_units_transpose_p_by_dma_on_trn2_only(rng):
    import ml_dtypes
    args = make_prefill_case(rng, [100], [400], 16, 2, 4, 64, q_dtype=ml_dtypes.bfloat16,
                             kv_dtype=ml_dtypes.bfloat16)
    for target, want in (("trn2", True), ("trn1", False)):
        with simulate.use_target(target):
            check(args, dtype="bfloat16")
            ops = {e.op for e in simulate.last_trace()}
        assert ("dma_transpose" in ops) == want, target


def test_head_major_tilings():
    assert head_major([(0, 1, 0), (0, 1, 32), (1, 1, 0), (1, 1, 32)]) == 2
    assert head_major([(0, 2, 0), (2, 2, 0)]) == 0                 # two heads a tile
    assert head_major([(0, 1, 0), (1, 1, 0), (0, 1, 32)]) == 0     # not head by head
    assert head_major([(0, 1, 0), (0, 1, 32), (1, 1, 0)]) == 0     # heads of unequal blocks


def _state_memsets(trace):
    return [e for e in trace if e.op == "memset" and e.operands[0].tensor in ("states", "state")]


@pytest.mark.sim_only
@pytest.mark.parametrize("options", [dict(causal=True), dict(causal=True, logits_soft_cap=5.0)],
                         ids=str)
def test_tails_set_whole_units_states_in_their_first_step(rng, options):
    """With tails (causal, trn2) a whole unit's states start blank and its tail's softmax step,
    the unit's first, sets them (grouped statistics, or per tile under a soft cap): no identity
    memsets, the output as the reference's; without tails (trn1) the states start as the
    identity."""
    args = make_prefill_case(rng, [40, 70, 64], [300, 140, 1000], 16, 2, 4, 32)
    for target, memsets in (("trn2", False), ("trn1", True)):
        with simulate.use_target(target):
            check(args, **options)
            assert bool(_state_memsets(simulate.last_trace())) == memsets, target
    with simulate.use_target("trn2"):
        check(args, lnc=2, **options)
        assert not _state_memsets(simulate.last_trace())
