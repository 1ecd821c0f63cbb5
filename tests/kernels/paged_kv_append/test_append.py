"""append_paged_kv_cache in the simulator vs the NumPy reference, bit for bit."""

import ml_dtypes
import numpy as np
import pytest

from nki_kernels import simulate
from nki_kernels.paged_kv_append import (append_paged_kv_cache, append_paged_kv_cache_ref,
                                         get_batch_indices_positions, reshape_and_cache)

from .conftest import assert_bits_equal, bits


def run_both(args):
    ref = append_paged_kv_cache_ref(*args)
    append_paged_kv_cache(*args)
    assert_bits_equal(args[4], ref)


def test_flashinfer_example(case, target):
    # FlashInfer test_page.py: appends [45, 8, 25, 22] into [3, 1, 2, 2] pages of 16,
    # last_page_len [13, 8, 9, 6] (45 = 2*16 + 13, 25 = 16 + 9, 22 = 16 + 6).
    args = case([45, 8, 25, 22], [45, 8, 25, 22], 16, 4, 16)
    assert args[6].tolist() == [0, 3, 4, 6, 8] and args[7].tolist() == [13, 8, 9, 6]
    run_both(args)


GRID = [  # (kv_lens, append_lens, page_size)
    ([1], [1], 1), ([17], [1], 16), ([16], [16], 16), ([33, 1, 129], [1, 1, 1], 16),
    ([5, 200, 77], [5, 73, 77], 8), ([128, 129], [64, 2], 128), ([300], [130], 32),
    ([9, 0, 12], [3, 0, 12], 4), (list(range(1, 18)), [1] * 17, 16),
]


@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("fused", [True, False], ids=["5d", "pair"])
@pytest.mark.parametrize("kv_lens, append_lens, page_size", GRID, ids=str)
def test_matches_reference(case, target, kv_lens, append_lens, page_size, layout, fused):
    run_both(case(kv_lens, append_lens, page_size, 3, 8, layout=layout, fused=fused))


DTYPES = [np.float32, np.float16, ml_dtypes.bfloat16, ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("H, D", [(1, 64), (8, 128), (2, 256), (3, 1)])
def test_dtypes_heads_dims(case, dtype, H, D):
    run_both(case([37, 5], [20, 1], 16, H, D, dtype=dtype, layout="NHD" if H in (1, 8) else "HND"))


def test_only_appended_slots_change(case, target):
    args = case([40, 23, 7], [9, 23, 1], 8, 2, 4, layout="HND")
    cache_before = bits(args[4]).copy()
    append_paged_kv_cache(*args)
    changed = (bits(args[4]) != cache_before).reshape(args[4].shape[0], 2, -1)
    # every changed byte was NaN before; exactly the appended K and V elements changed
    assert np.isnan(args[4]).sum() == np.isnan(np.full(args[4].shape, np.nan)).sum() - 2 * 33 * 2 * 4
    assert changed.any(axis=2).sum() > 0


def test_reshape_and_cache_skips_negative_slots(rng, target):
    N, P, H, D = 6, 4, 2, 8
    kc = np.full((N, P, H, D), np.nan, np.float32)
    vc = kc.copy()
    key = rng.standard_normal((5, H, D)).astype(np.float32)
    value = rng.standard_normal((5, H, D)).astype(np.float32)
    slots = np.array([3, -1, 17, 0, -5], np.int64)
    reshape_and_cache(key, value, kc, vc, slots)
    for t, s in enumerate(slots):
        if s >= 0:
            np.testing.assert_array_equal(kc[s // P, s % P], key[t])
            np.testing.assert_array_equal(vc[s // P, s % P], value[t])
    assert np.isnan(kc).sum() == (N * P - 3) * H * D


def test_get_batch_indices_positions_docstring_example():
    b, p = get_batch_indices_positions(np.array([0, 1, 3, 6, 10]), np.array([5, 5, 5, 5]), 12)
    assert b.tolist() == [0, 1, 1, 2, 2, 2, 3, 3, 3, 3, -1, -1]
    assert p.tolist() == [4, 3, 4, 2, 3, 4, 1, 2, 3, 4, 0, 0]
    assert b.dtype == p.dtype == np.int32


@pytest.mark.sim_only
@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_traffic_is_appended_bytes(case, target, layout):
    args = case([70, 130], [70, 130], 16, 4, 32, layout=layout)
    append_paged_kv_cache(*args)
    trace = simulate.last_trace()
    kv_bytes = args[0].nbytes + args[1].nbytes
    # + an int32 slot per token of the 256-token bucket (200 real, 56 padding). trn2: two
    # 128-token tiles, one static pass (a loop iteration costs more than a tile), each tile's K
    # and V read whole into SBUF (the second's 56 padding rows too) and written by one DMA where
    # real, + the [1, 2] counts table; trn1: tokens in blocks of 64 per loop iteration (+ the
    # counts), 4 blocks hold the 200 tokens; a block's slots come in one DMA
    if target == "trn2":
        assert trace.hbm_bytes == kv_bytes * 256 // 200 + kv_bytes + 4 * 256 + 8
        # slots, counts, then per tile K and V loaded and one write
        assert len(trace) == trace.program_instructions == 2 + 2 * 3
        assert not trace.loops
    else:
        assert trace.hbm_bytes == 2 * kv_bytes + 4 * 256 + 8
        assert len(trace) == 1 + 4 * (1 + 64 * 2)       # per block: its slots, K + V per token
        assert trace.program_instructions == 1 + 1 + 64 * 2          # one copy of the block
        assert [l["iterations"] for l in trace.loops] == [4]


@pytest.mark.sim_only
@pytest.mark.parametrize("fused", [True, False])
def test_a_padding_tile_moves_nothing(case, fused):
    """trn2, 300 tokens in a bucket of 512: four tiles issued, three holding tokens. A fused
    cache's tiles are loaded whole into SBUF and written by one DMA each, the fourth tile's
    loads skipped; a split cache writes K and V HBM to HBM, only the real rows. The cache
    matches the reference either way."""
    args = case([300], [300], 16, 4, 32, fused=fused)
    want = append_paged_kv_cache_ref(*args)
    with simulate.use_target("trn2"):
        append_paged_kv_cache(*args)
        trace = simulate.last_trace()
    kv_bytes = args[0].nbytes + args[1].nbytes
    if fused:
        assert trace.hbm_bytes == kv_bytes * 384 // 300 + kv_bytes + 4 * 512 + 8
        np.testing.assert_array_equal(args[4], want)
    else:
        assert trace.hbm_bytes == 2 * kv_bytes + 4 * 512
        for got, ref in zip(args[4], want):
            np.testing.assert_array_equal(got, ref)


@pytest.mark.sim_only
@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("H, parts", [(8, 2), (3, 1), (2, 2), (1, 1)])
def test_decode_sized_fused_append_is_one_write(case, layout, H, parts):
    """trn2, a fused cache, 32 tokens of which 5 padding rows: K and V staged in SBUF and
    written by one indirect DMA over 2 x 32 x parts partitions (the most head groups that fit),
    padding rows skipped; the cache equals the reference bit for bit."""
    kv_lens = [40, 23, 7, 1, 90] * 5 + [16, 1]
    args = case(kv_lens, [1] * 27, 16, H, 8, layout=layout)
    ref = append_paged_kv_cache_ref(*args)
    with simulate.use_target("trn2"):
        append_paged_kv_cache(*args)
    assert_bits_equal(args[4], ref)
    writes = _cache_writes(simulate.last_trace())
    assert len(writes) == 1 and writes[0].operands[0].shape[0] == 2 * 32 * parts
    runs = 1 if layout == "NHD" else H // parts          # heads of a part: one run, or H/parts
    assert writes[0].dma_runs == 2 * 27 * parts * runs


def _cache_writes(trace):
    """DMAs writing HBM from anything but the slot table: the cache writes."""
    return [e for e in trace if e.op == "dma_copy" and e.operands[0].buffer.endswith("hbm")]


@pytest.mark.sim_only
@pytest.mark.parametrize("fused, lnc", [(False, 1), (True, 2)])
def test_a_pair_or_two_cores_keep_one_write_per_k_and_v(case, fused, lnc):
    """Two tensors cannot share a DMA; under LNC=2 each core writes one of K and V already."""
    args = case([40, 23], [1, 1], 16, 4, 8, fused=fused)
    ref = append_paged_kv_cache_ref(*args)
    with simulate.use_target("trn2"):
        append_paged_kv_cache(*args, lnc=lnc)
    assert_bits_equal(args[4], ref)
    writes = _cache_writes(simulate.last_trace())
    assert len(writes) == 2 and all(w.operands[0].shape[0] == 2 for w in writes)


@pytest.mark.slow
@pytest.mark.parametrize("page_size", [1, 8, 16, 32, 128])
@pytest.mark.parametrize("batch", [1, 12, 17])
def test_flashinfer_grid(rng, case, target, page_size, batch):
    kv_lens = rng.integers(1, 400, size=batch)
    append = np.minimum(kv_lens, rng.integers(1, 64, size=batch))
    for layout in ("NHD", "HND"):
        run_both(case(kv_lens, append, page_size, 4, 64, layout=layout))
