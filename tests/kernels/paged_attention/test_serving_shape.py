"""Decode as a serving loop runs it: one compile per shape bucket, a program whose size does not
grow with batch or length, work that does, and LNC=2."""

import numpy as np
import pytest

from nki_kernels import simulate
from nki_kernels.buckets import BucketPolicy, set_bucket_policy
from nki_kernels.paged_attention import batch_decode, batch_decode_kernel, batch_decode_ref
from nki_kernels.paged_attention import work
from nki_kernels.paged_attention.work import (ITEM_CLASSES, MASKED_AGAIN, items_per_iteration,
                                              loop_widths)

from .conftest import assert_close, make_decode_case

pytestmark = pytest.mark.sim_only


def _grow(rng, lens, page_size=16, H=2, G=2, D=32):
    return make_decode_case(rng, lens, page_size, H, G, D)


class FixedCache:
    """One cache for a whole trace (as a server allocates it once): N pages of P tokens."""

    def __init__(self, rng, pages=256, page_size=16, H=2, G=2, D=32):
        self.rng, self.P, self.HQ, self.D = rng, page_size, H * G, D
        self.cache = rng.standard_normal((pages, 2, page_size, H, D)).astype(np.float32)

    def step(self, lens):
        """q and a page table giving each request its own random pages."""
        P = self.P
        counts = [-(-n // P) for n in lens]
        pages = self.rng.permutation(self.cache.shape[0])[:sum(counts)].astype(np.int32)
        indptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
        last = np.array([(n - 1) % P + 1 if n else 0 for n in lens], np.int32)
        q = self.rng.standard_normal((len(lens), self.HQ, self.D)).astype(np.float32)
        return q, self.cache, indptr, pages, last, "NHD"


def test_growing_trace_compiles_once_per_batch_bucket(rng, target):
    """Requests grow by one token per step, arrive and finish; the batch moves between the
    buckets 2 and 4 (powers of two); every step matches the reference. The window's size is
    runtime data; whether the launch has one at all is static (one more compile)."""
    simulate.reset_compile_stats()
    cache, batches = FixedCache(rng), []
    for step in range(12):
        batch = 2 if step < 5 else (3 if step < 9 else 4)
        lens = [7 + step + 5 * i for i in range(batch)]
        args = cache.step(lens)
        out, lse = batch_decode(*args, return_lse=True, window_left=9 if step % 2 else 4)
        ref, ref_lse = batch_decode_ref(*args, return_lse=True, window_left=9 if step % 2 else 4)
        assert_close(out, ref, lse, ref_lse)
        batches.append(batch)
    stats = simulate.compile_stats(batch_decode_kernel)
    # the window changes every step and is runtime data: it does not add compiles
    assert stats["compilations"] == 2, stats
    assert stats["hits"] == len(batches) - 2
    args = cache.step([7, 30, 60, 90])
    for window_left in (-1, 40):             # no window: its own program, then cached
        out, lse = batch_decode(*args, return_lse=True, window_left=window_left)
        ref, ref_lse = batch_decode_ref(*args, return_lse=True, window_left=window_left)
        assert_close(out, ref, lse, ref_lse)
    assert simulate.compile_stats(batch_decode_kernel)["compilations"] == 3


def test_exact_policy_compiles_per_batch_size(rng):
    previous = set_bucket_policy(BucketPolicy(exact=True))
    try:
        simulate.reset_compile_stats()
        for lens in ([5, 9, 2], [6, 10, 3], [6, 10, 3, 1], [6, 10]):
            batch_decode(*_grow(rng, lens))
        assert simulate.compile_stats(batch_decode_kernel)["compilations"] == 3
    finally:
        set_bucket_policy(previous)


def test_program_size_is_independent_of_lengths_and_work_follows_them(rng, target, monkeypatch):
    monkeypatch.setattr(work, "STATIC_MAX_SLOTS", 0)      # the device loops (no static pass)
    cache = FixedCache(rng, pages=400)
    sizes, executed, read = [], [], []
    for lens in ([1000, 700], [2000, 1500]):       # with the window, all three chunk loops run
        batch_decode(*cache.step(lens), window_left=400)
        trace = simulate.last_trace()
        sizes.append(trace.program_instructions)
        executed.append(len(trace))
        read.append(trace.hbm_bytes)
    assert sizes[0] == sizes[1]
    assert executed[0] == executed[1]               # 4 chunks per request in both steps
    assert read[0] == read[1]                        # same 401-token window in both
    loops = [l["iterations"] for l in trace.loops if l["depth"] == 0]
    # one loop per kind of work item (empty, a unit's first masked chunk, its tail, its further
    # masked chunks, mask-free blocks of 32, 16, 8, 4, 2, 1; decode has no tails) and width
    # (16, 8, 4, 2 and 1 items per iteration): each request has a masked first and last chunk (two first ones: one iteration
    # of 2; two further ones: one of 2) and a block of 2 mask-free chunks (two items: one
    # iteration of 2); the two requests' items share iterations
    widths = loop_widths(items_per_iteration(1))
    expected = [0] * (len(ITEM_CLASSES) * len(widths))
    expected[1 * len(widths) + widths.index(2)] = 1      # first masked chunks
    expected[MASKED_AGAIN * len(widths) + widths.index(2)] = 1      # further masked chunks
    expected[ITEM_CLASSES.index((2, False)) * len(widths) + widths.index(2)] = 1  # blocks of 2
    assert loops == expected
    assert not [l for l in trace.loops if l["depth"] > 0]      # no loop per request


def test_padded_batch_rows_do_no_work(rng, monkeypatch):
    """Batch 5 runs in bucket 8: the loops' trip counts follow the real batch (device data): the
    five masked single chunks and three null items (work.NullItems) run as one iteration of 8
    items, and the bucket's three padded rows are never visited."""
    monkeypatch.setattr(work, "STATIC_MAX_SLOTS", 0)      # the device loops (no static pass)
    batch_decode(*FixedCache(rng).step([40, 40, 40, 40, 40]))
    trace = simulate.last_trace()
    loops = [l["iterations"] for l in trace.loops]
    widths = loop_widths(items_per_iteration(1))
    assert widths == [16, 8, 4, 2, 1] and len(loops) == 10 * 5    # 10 kinds x 5 widths
    assert loops[5:10] == [0, 1, 0, 0, 0] and sum(loops) == 1      # masked chunks: 5 + 3 null


def test_long_requests_take_mask_free_chunks_in_blocks(rng, target):
    """A request of 42 chunks (the last partial, so masked): 41 mask-free chunks run as 1 block
    of 32, 1 of 8 and 1 single chunk, each a work item chained to the last through the
    softmax-state scratch; the output matches the reference."""
    from nki_kernels.paged_attention.kernel import CHUNK_BLOCKS
    assert CHUNK_BLOCKS == (32, 16, 8, 4, 2, 1)
    args = FixedCache(rng, pages=400).step([41 * 128 + 5])
    out, lse = batch_decode(*args, return_lse=True)
    trace = simulate.last_trace()
    loops = [l["iterations"] for l in trace.loops]
    # one iteration of width 1 (the last of each kind's loops) for kinds masked, 32, 8, 1
    widths_1 = loops[4::5]          # empty, masked, tail, masked again, 32, 16, 8, 4, 2, 1
    assert len(loops) == 10 * 5 and widths_1 == [0, 1, 0, 0, 1, 0, 1, 0, 0, 1]
    assert sum(loops) == 4
    ref, ref_lse = batch_decode_ref(*args, return_lse=True)
    np.testing.assert_allclose(out, ref, rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(lse, ref_lse, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("window_left, windowed", [(-1, False), (0, True), (63, True),
                                                   (1 << 30, False)])
def test_the_window_check_is_static_only_when_a_window_can_cut(rng, window_left, windowed):
    """Without a window (or one longer than any cache) every window start is 0 and the kernel
    is built without its checks; any real window keeps them."""
    from nki_kernels.paged_attention.checks import check_batch_prefill_inputs
    from nki_kernels.paged_attention.plan import WINDOWED, prefill_parts, prepare_decode
    cache = FixedCache(rng)
    args = cache.step([40, 300])
    decode = prepare_decode(*args, None, 0.0, window_left, None, 1.0, 1.0)
    assert decode.statics[WINDOWED] is windowed
    q, c, indptr, pages, last, layout = args
    qo = np.array([0, 4, 8], np.int32)
    prob, q_lens = check_batch_prefill_inputs(np.repeat(q, 4, axis=0), c, qo, indptr, pages, last,
                                              layout, True, None, 0.0, window_left, None, 1.0, 1.0)
    parts = prefill_parts(prob, q_lens, qo, c, True, 0.0, window_left, None, 1.0, 1.0, 1)
    assert [part.launch.statics[WINDOWED] for part in parts] == [windowed]
