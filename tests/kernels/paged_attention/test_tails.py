"""Blocks of queries (speculative verification) end each unit in one tail item (work.TAIL): its
masked chunks and the mask-free chunks past the unit's whole blocks of TAIL_CHUNKS, gathered as
one block whose slots past the unit's keys read nothing."""

import numpy as np
import pytest

from nki_kernels import simulate

from .test_prefill import check, make_prefill_case


def _tail_blocks():
    """Instructions of the last launch that made a tail's mask predicate (``block_keep``: the
    one-block masked gathers, which a verification launch runs for its tails only)."""
    return sum(1 for ev in simulate.last_trace().events
               if ev.operands and ev.operands[0].tensor == "block_keep")


# q_lens, kv_lens, page size: tails of 1 to 4 chunks (the last partial or whole, past blocks of
# 4 mask-free chunks or none), drafts straddling a chunk boundary, a window
CASES = [
    ([4, 4, 4], [1021, 1100, 130], 16),
    ([8, 2, 5], [600, 257, 384], 8),
    ([3, 7], [129, 513], 32),
    ([6], [2000], 16),
]


@pytest.mark.parametrize("lnc", [1, 2])
@pytest.mark.parametrize("q_lens, kv_lens, page_size", CASES, ids=str)
def test_tails_match_the_reference(rng, q_lens, kv_lens, page_size, lnc):
    args = make_prefill_case(rng, q_lens, kv_lens, page_size, 2, 4, 32)
    with simulate.use_target("trn2"):
        check(args, lnc=lnc, causal=True)
        assert _tail_blocks() > 0
        check(args, lnc=lnc, causal=True, window_left=300)


def test_a_split_units_first_part_ends_its_tail_at_the_cut(rng):
    """One request on two cores: the first core's part ends inside the request's keys, so its
    tail's slots past the cut (keys the second core takes) read nothing: each key counted once
    (``LEN`` clipped to the tail's chunks)."""
    for kv in (700, 1000, 1500):
        args = make_prefill_case(rng, [4], [kv], 16, 2, 4, 32)
        with simulate.use_target("trn2"):
            check(args, lnc=2, causal=True)

