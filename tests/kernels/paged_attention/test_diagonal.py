"""Whole units' tails scored up to each query tile's diagonal: the host puts a unit's padding
rows first (``work.right_aligned``), so row qi of every unit sits at position LEN - Qb + qi and
the tail columns a tile of rows can need are static (``kernel_items.diagonal_columns``).
Checked: the host's rows, the columns per tile, and the kernel against the reference on
fresh prompts, short prefixes and windows, scoring fewer columns than without it."""

from types import SimpleNamespace

import ml_dtypes
import numpy as np
import pytest

from nki_kernels import simulate
from nki_kernels.paged_attention import kernel_items
from nki_kernels.paged_attention.kernel_items import DIAGONAL_COLUMNS, diagonal_columns
from nki_kernels.paged_attention.work import query_blocks, right_aligned

from .test_prefill import check, make_prefill_case


@pytest.mark.parametrize("qb", [32, 64, 256])
def test_a_units_rows_end_at_its_last_query(rng, qb):
    """Every item's row qi sits at position L - qb + qi (its last row is its last query); the
    real rows keep their positions and keys, the padding rows come first."""
    q_lens = rng.integers(1, 300, 9)
    kv_lens = q_lens + rng.integers(0, 700, 9)
    kv_indptr = np.concatenate([[0], np.cumsum(-(-kv_lens // 16))])
    plain = query_blocks(kv_indptr, kv_lens, q_lens, qb, -1, True, 16)
    moved = right_aligned(plain, q_lens, qb)
    for k in range(plain.L.size):
        real = min(int(q_lens[plain.request[k]] - plain.q0[k]), qb)
        assert moved.first_row[k] == qb - real
        assert moved.hi_base[k] - 1 + qb - 1 == moved.L[k] - 1           # the last row's position
        rows = np.arange(moved.first_row[k], qb)
        assert np.array_equal(moved.q0[k] + rows, plain.q0[k] + np.arange(real))
        assert np.array_equal(moved.hi_base[k] + rows, plain.hi_base[k] + np.arange(real))
    for name in ("L", "W", "c0", "c1", "full_lo", "full_hi", "out"):
        assert np.array_equal(getattr(moved, name), getattr(plain, name))


def _step(Qb, Qt=32, T=128):
    return SimpleNamespace(T=T, Qb=Qb, Qt=Qt, tiles=[(0, 1, q0) for q0 in range(0, Qb, Qt)])


def test_a_tiles_columns_stop_at_its_diagonal():
    """256 queries over a tail of two chunks: tile j keeps 32 (j + 1) columns; of eight chunks
    in steps of four, the first step is whole for every tile and the second ends at the
    diagonal; a tile whose keys all precede the tail keeps the least; off, every column."""
    st = _step(256)
    assert [diagonal_columns(st, True, 2, 4, 0, t, 2) for t in range(8)] == \
        [32 * (j + 1) for j in range(8)]
    assert [diagonal_columns(st, True, 8, 4, 0, t, 4) for t in range(8)] == [512] * 8
    assert [diagonal_columns(st, True, 8, 4, 1, t, 4) for t in range(8)] == \
        [288 + 32 * j for j in range(8)]
    assert diagonal_columns(_step(1024), True, 2, 4, 0, 0, 2) == DIAGONAL_COLUMNS
    assert diagonal_columns(st, False, 2, 4, 0, 0, 2) == 256
    st = _step(96)                     # the bound rounds up to whole multiples of 32
    assert [diagonal_columns(st, True, 3, 4, 0, t, 3) for t in range(3)] == [320, 352, 384]


def _scored():
    """Score columns the last launch's selections kept, summed over rows."""
    return sum(e.free_elems * e.partitions for e in simulate.last_trace()
               if e.op in ("range_select", "select_reduce"))


CASES = [  # q_lens, kv_lens: fresh prompts, short prefixes, a unit of several blocks
    ([256], [256]),
    ([200, 77, 256], [200, 90, 300]),
    ([129, 33, 300], [129, 1000, 700]),
]


@pytest.mark.sim_only
@pytest.mark.parametrize("lnc", [1, 2])
@pytest.mark.parametrize("case", CASES, ids=str)
def test_diagonal_tails_match_the_reference_and_score_fewer_columns(rng, monkeypatch, case,
                                                                    lnc):
    args = make_prefill_case(rng, *case, 16, 2, 4, 32)
    with simulate.use_target("trn2"):
        check(args, causal=True, lnc=lnc)
        narrowed = _scored()
        check(args, causal=True, lnc=lnc, window_left=50)
        monkeypatch.setattr(kernel_items, "diagonal_columns",
                            lambda st, diagonal, count, width, s, t, have: have * st.T)
        simulate.reset_compile_stats()         # (another program under the same keys)
        try:
            check(args, causal=True, lnc=lnc)
            assert narrowed < _scored()
        finally:
            simulate.reset_compile_stats()


@pytest.mark.sim_only
def test_diagonal_tails_in_bfloat16(rng):
    bf16 = np.dtype(ml_dtypes.bfloat16)
    args = make_prefill_case(rng, [200, 77], [200, 333], 16, 2, 4, 64, q_dtype=bf16,
                             kv_dtype=bf16)
    with simulate.use_target("trn2"):
        check(args, dtype="bfloat16", causal=True)
