"""Whole units' tails select their keys by per-row bounds (``kernel_softmax.KeyRange``: one
``range_select`` a softmax step on NeuronCore-v3+) instead of a predicate tile made first on
VectorE. Checked: which launches take it (trn2 without a soft cap or a custom mask), that
they then make no tail predicate, and the outputs against the reference over the cases the
selection must get right: steps past a short unit's keys, rows whose keys all lie before
the tail, a sliding window's lower bound, the cache's NaN past every request's keys."""

import numpy as np
import pytest

from nki_kernels import simulate

from .test_custom_mask import causal_masks, flatten
from .test_prefill import check, make_prefill_case

# Chunks of 40-512 queries over 77-1500 keys (page 16): units of one to twelve chunks, tails of
# several slots (the short units' later steps see no key), rows of the 512-query chunk whose
# keys all end before its tail
Q_LENS = [40, 37, 512, 40, 40, 33]
KV_LENS = [1000, 300, 1500, 257, 77, 129]


def _ops(name):
    return sum(1 for e in simulate.last_trace() if e.op == name)


def _tail_predicates():
    return sum(1 for e in simulate.last_trace() for o in e.operands if o.tensor == "tail_keep")


@pytest.mark.sim_only
@pytest.mark.parametrize("lnc", [1, 2])
def test_tails_select_by_range_on_trn2(rng, lnc):
    args = make_prefill_case(rng, Q_LENS, KV_LENS, 16, 2, 4, 32)
    with simulate.use_target("trn2"):
        check(args, causal=True, lnc=lnc)
        assert _ops("range_select") > 0
        assert _tail_predicates() == 0


@pytest.mark.sim_only
@pytest.mark.parametrize("target, options", [
    ("trn1", dict(causal=True)),                             # NeuronCore-v2: no range_select
    ("trn2", dict(causal=True, logits_soft_cap=3.0)),        # a cap selects after its tanh
])
def test_tails_keep_their_predicate_otherwise(rng, target, options):
    args = make_prefill_case(rng, Q_LENS, KV_LENS, 16, 2, 4, 32)
    with simulate.use_target(target):
        check(args, **options)
        assert _ops("range_select") == 0


@pytest.mark.sim_only
def test_a_custom_mask_keeps_the_predicate(rng):
    """A custom mask's bits join the predicate: the tails make it as before (causal masks here,
    so the output is the causal one)."""
    args = make_prefill_case(rng, Q_LENS, KV_LENS, 16, 2, 4, 32)
    with simulate.use_target("trn2"):
        check(args, custom_mask=flatten(causal_masks(Q_LENS, KV_LENS)))
        assert _ops("range_select") == 0


@pytest.mark.sim_only
@pytest.mark.parametrize("lnc", [1, 2])
@pytest.mark.parametrize("window_left", [0, 50, 700])
def test_a_sliding_window_bounds_the_range_below(rng, lnc, window_left):
    args = make_prefill_case(rng, Q_LENS, KV_LENS, 16, 2, 4, 32)
    with simulate.use_target("trn2"):
        check(args, causal=True, lnc=lnc, window_left=window_left)
        assert _ops("range_select") > 0


@pytest.mark.sim_only
def test_bf16_llama_layer_heads(rng):
    """Eight kv heads of 128 over groups of four (a Llama-3-8B layer's score tiles: one kv head
    a tile, three tiles a unit of 96 queries), bf16 cache and queries."""
    import ml_dtypes
    args = make_prefill_case(rng, [96, 96, 96], [1000, 114, 377], 16, 8, 4, 128,
                             q_dtype=ml_dtypes.bfloat16, kv_dtype=ml_dtypes.bfloat16)
    with simulate.use_target("trn2"):
        check(args, dtype="bfloat16", causal=True, lnc=2)
        assert _ops("range_select") > 0


@pytest.mark.sim_only
@pytest.mark.parametrize("lnc", [1, 2])
@pytest.mark.parametrize("window_left", [-1, 30])
def test_verification_blocks_select_by_range(rng, lnc, window_left):
    """Speculative verification (4 and 3 drafts over 90-1300 keys): its blocks of masked chunks
    (``static_block_keep``) take bounds too."""
    args = make_prefill_case(rng, [4, 3, 4, 4, 4], [1300, 90, 701, 129, 1000], 16, 2, 4, 32)
    with simulate.use_target("trn2"):
        check(args, causal=True, lnc=lnc, window_left=window_left)
        assert _ops("range_select") > 0
        assert sum(1 for e in simulate.last_trace() for o in e.operands
                   if o.tensor == "block_keep") == 0
