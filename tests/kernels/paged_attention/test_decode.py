"""batch_decode in the simulator vs the float64 reference over a grid, with every option."""

import ml_dtypes
import numpy as np
import pytest

from nki_kernels import simulate
from nki_kernels.paged_attention import batch_decode, batch_decode_ref

from .conftest import assert_close, make_decode_case

GRID = [  # kv_lens, page_size
    ([1], 1), ([15, 16, 17], 16), ([127, 129], 128), ([5, 0, 33], 8), ([200], 32), ([1000], 16),
]


@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("kv_lens, page_size", GRID, ids=str)
def test_matches_reference(rng, target, kv_lens, page_size, layout):
    args = make_decode_case(rng, kv_lens, page_size, 2, 4, 32, layout=layout)
    out, lse = batch_decode(*args, return_lse=True)
    ref, ref_lse = batch_decode_ref(*args, return_lse=True)
    assert_close(out, ref, lse, ref_lse)


@pytest.mark.parametrize("group", [1, 8])
@pytest.mark.parametrize("D", [64, 128, 256])
def test_group_sizes_and_head_dims(rng, group, D):
    args = make_decode_case(rng, [37, 3], 16, 1 if group == 8 else 2, group, D, fused=False)
    assert_close(batch_decode(*args), batch_decode_ref(*args))


@pytest.mark.parametrize("q_dtype, kv_dtype", [
    ("float16", "float16"), ("bfloat16", "bfloat16"), ("float32", "bfloat16"),
    ("bfloat16", "float8_e4m3fn"), ("bfloat16", "float8_e5m2")])
def test_dtypes(rng, q_dtype, kv_dtype):
    qd, kd = (np.dtype(getattr(ml_dtypes, n, None) or n) for n in (q_dtype, kv_dtype))
    args = make_decode_case(rng, [40, 9], 8, 2, 2, 64, q_dtype=qd, kv_dtype=kd)
    scales = dict(k_scale=0.5, v_scale=2.0) if "float8" in kv_dtype else {}
    out = batch_decode(*args, **scales)
    assert out.dtype == qd
    coarser = kv_dtype if np.dtype(kd).itemsize < np.dtype(qd).itemsize or kv_dtype == "bfloat16" else q_dtype
    assert_close(out, batch_decode_ref(*args, **scales), dtype=coarser)


@pytest.mark.parametrize("options", [
    dict(sm_scale=0.3), dict(logits_soft_cap=5.0), dict(window_left=0), dict(window_left=20),
    dict(window_left=200), dict(sinks=np.linspace(-1, 2, 6).astype(np.float32)),
    dict(logits_soft_cap=2.0, window_left=33, sinks=np.ones(6, np.float32)),
], ids=lambda o: ",".join(o))
def test_options(rng, target, options):
    args = make_decode_case(rng, [70, 1, 150, 0], 16, 2, 3, 32)
    out, lse = batch_decode(*args, return_lse=True, **options)
    ref, ref_lse = batch_decode_ref(*args, return_lse=True, **options)
    assert_close(out, ref, lse, ref_lse)


def test_empty_request_gives_zeros_and_minus_inf(rng, target):
    args = make_decode_case(rng, [0, 5], 4, 1, 2, 16)
    out, lse = batch_decode(*args, return_lse=True)
    assert not out[0].any() and np.isneginf(lse[0]).all()
    assert np.isfinite(out).all()


def test_hand_computed_two_keys():
    # One request, 2 keys, D = 1, scale 1: logits q*k = [1*1, 1*2] -> softmax [1/(1+e), e/(1+e)];
    # out = 10/(1+e) + 20e/(1+e); LSE2 = log2(e^1 + e^2).
    cache = np.zeros((1, 2, 2, 1, 1), np.float32)
    cache[0, 0, :, 0, 0] = [1, 2]
    cache[0, 1, :, 0, 0] = [10, 20]
    q = np.ones((1, 1, 1), np.float32)
    ptr, idx, last = np.array([0, 1], np.int32), np.array([0], np.int32), np.array([2], np.int32)
    out, lse = batch_decode(q, cache, ptr, idx, last, sm_scale=1.0, return_lse=True)
    e = np.e
    np.testing.assert_allclose(out[0, 0, 0], (10 + 20 * e) / (1 + e), rtol=1e-6)
    np.testing.assert_allclose(lse[0, 0], np.log2(e + e ** 2), rtol=1e-6)


@pytest.mark.sim_only
def test_reads_only_owned_tokens(rng, target):
    kv = [33, 7]
    args = make_decode_case(rng, kv, 16, 2, 1, 32)
    batch_decode(*args)
    trace = simulate.last_trace()
    kv_bytes = sum(kv) * 2 * 2 * 32 * 4                 # tokens x (K, V) x heads x D x fp32
    kv_loads = [e for e in trace if e.op == "dma_copy" and e.operands[1].indirect is not None
                and e.operands[0].tensor in ("k_sb", "v_sb", "kv_raw")]   # K/V through the page table
    read = sum(e.hbm_read_bytes for e in kv_loads)
    if target == "trn2":
        assert read == kv_bytes                           # exactly the owned tokens
    else:
        assert read == 4 * 2 * 16 * 2 * 32 * 4           # whole owned pages: 3 + 1, K and V


@pytest.mark.slow
@pytest.mark.parametrize("batch, kv_max", [(64, 300), (4, 4000)])
def test_long_and_wide(rng, batch, kv_max):
    kv = rng.integers(0, kv_max, size=batch).tolist()
    args = make_decode_case(rng, kv, 16, 2, 4, 64)
    out, lse = batch_decode(*args, return_lse=True)
    ref, ref_lse = batch_decode_ref(*args, return_lse=True)
    assert_close(out, ref, lse, ref_lse)


@pytest.mark.parametrize("H, G", [(3, 48), (20, 8)])
def test_head_groups_beyond_128_rows(rng, target, H, G):
    # kv heads are processed in groups of <= 128 query rows: (2 + 1) heads of 48, (16 + 4) of 8
    args = make_decode_case(rng, [20, 5], 4, H, G, 16, layout="HND")
    out, lse = batch_decode(*args, return_lse=True, sinks=np.linspace(-1, 1, H * G).astype(np.float32))
    ref, ref_lse = batch_decode_ref(*args, return_lse=True, sinks=np.linspace(-1, 1, H * G).astype(np.float32))
    assert_close(out, ref, lse, ref_lse)


@pytest.mark.parametrize("window_left", [42, 43, 44, 170, 171, 172, 299])
def test_window_start_on_and_beside_a_chunk_boundary(rng, target, window_left):
    """kv_len 300, page 16 (chunks of 128 tokens): the window's first key 300 - w - 1 falls on
    key 256 or 128 (a chunk's first key), one before or one after it."""
    args = make_decode_case(rng, [300, 300], 16, 2, 2, 16)
    out, lse = batch_decode(*args, return_lse=True, window_left=window_left)
    ref, ref_lse = batch_decode_ref(*args, return_lse=True, window_left=window_left)
    assert_close(out, ref, lse, ref_lse)


@pytest.mark.parametrize("window_left, c0, full_lo", [(43, 2, 2), (44, 1, 2), (42, 2, 3),
                                                      (171, 1, 1), (-1, 0, 0)])
def test_window_chunks_on_a_boundary_are_full_not_masked(window_left, c0, full_lo):
    """Key 300 - w - 1 as the window start W: the chunk starting at W is a full chunk (no mask);
    chunks before it are not visited."""
    from nki_kernels.paged_attention.work import C0, C1, FULL_HI, FULL_LO, request_table
    row = request_table(np.array([0, 19]), np.array([300]), window_left, 16, 1)[0]
    assert (row[C0], row[FULL_LO], row[FULL_HI], row[C1]) == (c0, full_lo, max(full_lo, 2), 3)
