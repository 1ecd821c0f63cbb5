"""Verification steps in a static pass: items of one tile of query rows (a request's drafts,
q_len up to 128 / group, under a custom mask too) take the decode static pass's plan (``work.static_pass``: no device
loops when they would cost more), each table row writing its Qb output rows from row * Qb.
Checked: the policy's choice, the rows' outputs, and the kernel against the reference over odd
lengths, drafts, windows, sinks and soft caps on trn2 (LNC=1 and 2: halves, a split request,
sections), trn1 keeping its loops."""

import ml_dtypes
import numpy as np
import pytest

from nki_kernels import simulate
from nki_kernels.paged_attention import batch_decode_kernel
from nki_kernels.paged_attention.work import (NullItems, OUT, query_blocks, static_pass,
                                              static_work)

from .test_prefill import check, make_prefill_case
from .test_serving_shape import FixedCache


def _req(kv_lens, drafts, P=16):
    kv_lens = np.asarray(kv_lens)
    indptr = np.concatenate([[0], np.cumsum(-(-kv_lens // P))])
    return query_blocks(indptr, kv_lens, np.full_like(kv_lens, drafts), drafts, -1, True, P)


def test_small_verification_steps_take_the_static_pass():
    """One to sixteen requests of 2-8 drafts over 512-2048 keys: no loops (their barriers and
    fills cost more than the static rows' padding)."""
    assert static_pass(_req([1024], 4), 16, 1) == 8
    assert static_pass(_req([1024] * 4, 8), 16, 4) == 8
    assert static_pass(_req([700, 1300] * 8, 4), 16, 16) == 12
    assert static_pass(_req([2048] * 2, 2), 16, 2, cores=2) == 16
    assert static_pass(_req([1024], 4), 16, 1, nc_version=2) == 0      # trn1: loops


def test_each_row_writes_its_drafts_rows():
    """A row of q_block drafts writes its outputs from row * q_block; the bucket's empty rows
    after the requests' too (past them, nothing of theirs is read back)."""
    req = _req([300, 40, 900], 4)
    work = static_work(req, 16, 4, 8, NullItems(100, 16), q_block=4)
    assert list(work.items[:, OUT]) == [0, 4, 8, 12]


def _loops():
    return simulate.last_trace().loops


CASES = [  # q_lens (drafts, ragged), kv_lens: straddling pages and chunks
    ([4], [1000]),
    ([2, 8, 5], [17, 1300, 129]),
    ([3, 3, 3, 1, 6], [255, 256, 257, 40, 700]),
]


@pytest.mark.sim_only
@pytest.mark.parametrize("lnc", [1, 2])
@pytest.mark.parametrize("case", CASES, ids=str)
def test_static_verification_matches_the_reference(rng, case, lnc):
    args = make_prefill_case(rng, *case, 16, 2, 4, 32)
    with simulate.use_target("trn2"):
        check(args, causal=True, lnc=lnc)
        assert not [loop for loop in _loops() if loop["iterations"]]
        check(args, causal=True, lnc=lnc, window_left=100)
        check(args, causal=True, lnc=lnc, sinks=np.linspace(-1, 1, 8).astype(np.float32),
              logits_soft_cap=5.0)


@pytest.mark.sim_only
def test_a_bucket_of_several_sections_and_bfloat16(rng):
    """Nine requests of four drafts over 64-2000 keys (a spread bucket: sections) in
    bfloat16, on both cores."""
    bf16 = np.dtype(ml_dtypes.bfloat16)
    kv = [64, 2000, 130, 900, 1500, 77, 300, 1999, 640]
    args = make_prefill_case(rng, [4] * 9, kv, 16, 2, 4, 64, q_dtype=bf16, kv_dtype=bf16)
    with simulate.use_target("trn2"):
        for lnc in (1, 2):
            check(args, dtype="bfloat16", causal=True, lnc=lnc)


@pytest.mark.sim_only
def test_it_compiles_once_per_chunk_count(rng):
    """One cache, new lengths and pages each step: 7-8 chunks share a program, 9-12 a
    second."""
    cache = FixedCache(rng, pages=200)
    with simulate.use_target("trn2"):
        simulate.reset_compile_stats()
        for kv in ([900, 1000], [1020, 800], [897, 1024], [1100, 1500]):
            q, paged, indptr, pages, last, layout = cache.step(kv)
            q = rng.standard_normal((8, q.shape[1], q.shape[2])).astype(np.float32)
            qo = np.array([0, 4, 8], np.int32)
            args = (q, paged, qo, indptr, pages, last, layout)
            check(args, causal=True)
            assert not _loops()
        assert len(simulate.compile_keys(batch_decode_kernel)) == 2


@pytest.mark.sim_only
def test_trn1_keeps_the_loops(rng):
    args = make_prefill_case(rng, [4, 3], [1000, 300], 16, 2, 4, 32)
    with simulate.use_target("trn1"):
        check(args, causal=True)
        assert _loops()


@pytest.mark.sim_only
@pytest.mark.parametrize("lnc", [1, 2])
def test_tree_masks_in_a_static_pass_follow_their_rows(rng, lnc):
    """Drafts under custom masks (trees) in the static pass: a spread batch's rows are dealt by
    length (LNC=2 halves, sections), each row's mask bits where its row is, not its request
    index; decode rows with masks too."""
    from .test_custom_mask import check as check_masked, random_masks
    for q_lens, kv_lens in (([8, 8, 8, 5, 8], [2048, 300, 1500, 64, 900]),
                            ([1, 1, 1], [17, 200, 1])):
        args = make_prefill_case(rng, q_lens, kv_lens, 16, 2, 4, 32)
        with simulate.use_target("trn2"):
            check_masked(args, random_masks(rng, q_lens, kv_lens), lnc=lnc)
            assert not [loop for loop in _loops() if loop["iterations"]]
