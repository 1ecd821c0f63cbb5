"""Null items: a kind's last loop iteration padded with items that read no keys and write nothing
(work.NullItems). The host pads only where the model's costs favour it; on device a null item's
gathers, query load and output writes are skipped, its state goes to the discard slot."""

import numpy as np
import pytest

from nki_kernels import simulate
from nki_kernels.paged_attention import work
from nki_kernels.paged_attention import batch_decode, batch_decode_ref, batch_prefill
from nki_kernels.paged_attention import plan as plan_module
from nki_kernels.paged_attention.reference import batch_prefill_ref
from nki_kernels.paged_attention.work import (
    CHUNK_BLOCKS, DECODE_ITEMS_PER_ITERATION, ITEM_CLASSES, LEN, LOAD, NULL_MAX_CHUNKS, NULL_ROWS,
    OUT, PTR, STORE, NullItems, decode_work, loop_iterations, padded_counts, state_slots,
    table_rows)

from .conftest import make_decode_case

U = DECODE_ITEMS_PER_ITERATION


def _kind(size, masked=False):
    return ITEM_CLASSES.index((size, masked))


def test_padding_never_adds_iterations_and_skips_large_kinds():
    counts = np.zeros((U, len(ITEM_CLASSES)), np.int64)
    counts[:, :] = np.arange(U)[:, None]
    padded = padded_counts(counts, U)
    assert (padded >= counts).all() and (padded <= U).all()
    for r in range(U):                                   # never more iterations than unpadded
        for k in range(len(ITEM_CLASSES)):
            one = np.zeros(len(ITEM_CLASSES), np.int64)
            one[k], pad = r, np.zeros(len(ITEM_CLASSES), np.int64)
            pad[k] = padded[r, k]
            assert loop_iterations(pad, U) <= loop_iterations(one, U)
    # the empty kind and blocks past NULL_MAX_CHUNKS are never padded
    never = [0] + [_kind(s) for s in CHUNK_BLOCKS if s > NULL_MAX_CHUNKS]
    assert (padded[:, never] == counts[:, never]).all()
    # 5 masked chunks: one iteration of 8 (3 null items) rather than 4 + 1
    assert padded[5, _kind(1, True)] == 8
    assert padded_counts(np.eye(len(ITEM_CLASSES), dtype=np.int64)[1] * 21, U)[1] == 24


def test_null_rows_point_past_the_cache_and_the_outputs():
    null = NullItems(slot=500, out=8)
    lens = np.array([40, 40, 40, 40, 40])                  # one masked chunk each
    indptr = np.concatenate([[0], np.cumsum(-(-lens // 16))])
    work = decode_work(indptr, lens, -1, 16, 8, null=null, capacity=100)
    rows = work.items[:8]
    real, nulls = rows[:5], rows[5:8]
    assert (nulls[:, OUT] == 8).all() and (nulls[:, PTR] == 500).all() and (nulls[:, LEN] == 0).all()
    assert (nulls[:, LOAD] == state_slots(8)).all() and (nulls[:, STORE] == state_slots(8)).all()
    assert sorted(real[:, OUT]) == [0, 1, 2, 3, 4]
    assert (real[:, STORE] == state_slots(8)).all()       # each its unit's only item: no state kept
    # without NullItems nothing is padded: iterations of 4 and 1
    plain = decode_work(indptr, lens, -1, 16, 8, capacity=100)
    assert (plain.items[5:, OUT] == 0).all() and (plain.items[5:, LEN] == 0).all()


def test_the_table_bound_holds_for_the_most_padding():
    """Every paddable kind with one item on both cores: NULL_ROWS covers the nulls added."""
    worst = 2 * sum(int(padded_counts(np.eye(len(ITEM_CLASSES), dtype=np.int64)[k], U)[k]) - 1
                    for k in range(len(ITEM_CLASSES)))
    assert worst <= NULL_ROWS
    assert table_rows(1, 10) >= NULL_ROWS


@pytest.mark.parametrize("target", ["trn1", "trn2"])
def test_null_items_read_no_keys_and_change_no_result(rng, monkeypatch, target):
    """A step whose kinds are padded reads exactly the cache bytes and writes exactly the output
    bytes of the same step planned without null items (their gathers, query loads and writes
    all skip, so do their states': they move only their table rows and page ids), and gives
    the same outputs."""
    lens = [40, 300, 47, 129, 260, 77, 5]
    args = make_decode_case(rng, lens, 16, 2, 2, 32)
    monkeypatch.setattr(work, "STATIC_MAX_SLOTS", 0)      # the device loops (no static pass)
    with simulate.use_target(target):
        out, lse = batch_decode(*args, return_lse=True)
        padded = simulate.last_trace()
        monkeypatch.setattr(plan_module, "null_items", lambda *a, **k: None)
        out0, lse0 = batch_decode(*args, return_lse=True)
        plain = simulate.last_trace()
    assert sum(l["iterations"] for l in padded.loops) < sum(l["iterations"] for l in plain.loops)
    assert _moved(padded, "k_rows") == _moved(plain, "k_rows") > 0
    assert _moved(padded, "q") == _moved(plain, "q") > 0
    assert _moved(padded, "out") == _moved(plain, "out") > 0
    assert _moved(padded, "lse") == _moved(plain, "lse") > 0
    np.testing.assert_array_equal(out, out0)
    np.testing.assert_array_equal(lse, lse0)
    ref, ref_lse = batch_decode_ref(*args, return_lse=True)
    np.testing.assert_allclose(out, ref, rtol=2e-5, atol=2e-5)


def _moved(trace, tensor):
    """Bytes the launch's DMAs moved to or from HBM tensor ``tensor``."""
    total = 0
    for e in trace:
        if e.engine == "dma" and any(o.tensor == tensor for o in e.operands):
            total += e.dma_bytes
    return total


def test_verification_blocks_with_null_items_match_the_reference(rng):
    """Blocks of 4 queries (flat-list items) padded with null items: the reference holds."""
    P, H, G, D = 16, 2, 2, 32
    kv_lens = np.array([70, 200, 33, 150, 90])
    q_lens = np.array([4, 4, 4, 4, 4])
    pages = -(-kv_lens // P)
    indptr = np.concatenate([[0], np.cumsum(pages)]).astype(np.int32)
    indices = rng.permutation(int(pages.sum()) + 3)[:int(pages.sum())].astype(np.int32)
    last = ((kv_lens - 1) % P + 1).astype(np.int32)
    cache = rng.standard_normal((int(pages.sum()) + 3, 2, P, H, D)).astype(np.float32)
    q = rng.standard_normal((int(q_lens.sum()), H * G, D)).astype(np.float32)
    qo = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    with simulate.use_target("trn2"):
        out = batch_prefill(q, cache, qo, indptr, indices, last, causal=True)
    ref = batch_prefill_ref(q, cache, qo, indptr, indices, last, causal=True)
    np.testing.assert_allclose(out, ref, rtol=2e-5, atol=2e-5)
