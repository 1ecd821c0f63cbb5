"""fp8 quantize-on-write: wider K/V rows into an fp8 cache with per-tensor or per-head scales,
bit for bit the reference (``x * f32(1/scale)``, clamped, round to nearest even), within one fp8
step of ``x / scale``; the fused write of ``batch_prefill`` and the block-table entry do the
same; attention reads back with the same scales; refusals before any write."""

import ml_dtypes
import numpy as np
import pytest

from nki_kernels.block_tables import append_kv_with_block_tables
from nki_kernels.paged_attention import batch_decode, batch_prefill, batch_prefill_ref
from nki_kernels.paged_kv_append import append_paged_kv_cache, reshape_and_cache
from nki_kernels.paged_cache.quantize import quantize_ref

N, P, H, D = 12, 4, 2, 16
E4M3, E5M2 = ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2


def _table(rng, lens):
    """CSR page table over distinct random pages for requests of ``lens`` tokens."""
    counts = [-(-n // P) for n in lens]
    pages = rng.permutation(N)[: sum(counts)].astype(np.int32)
    indptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    last = np.array([n - (c - 1) * P for n, c in zip(lens, counts)], np.int32)
    return pages, indptr, last


def _rows(rng, T, dtype, spread=40.0):
    return (rng.standard_normal((T, H, D)) * spread).astype(dtype)


def _tokens(cache, pages, indptr, lens, layout, which):
    """The K (which 0) or V rows of every request's tokens, in order."""
    out = []
    for b, n in enumerate(lens):
        for pos in range(n):
            page = pages[indptr[b] + pos // P]
            blk = cache[page, which]
            out.append(blk[pos % P] if layout == "NHD" else blk[:, pos % P])
    return np.stack(out)


@pytest.mark.parametrize("fp8", [E4M3, E5M2], ids=["e4m3fn", "e5m2"])
@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("scales", ["tensor", "head"])
def test_append_quantizes_like_the_reference(rng, target, fp8, layout, scales):
    lens = [5, 1, 7]
    pages, indptr, last = _table(rng, lens)
    T = sum(lens)
    k, v = _rows(rng, T, ml_dtypes.bfloat16), _rows(rng, T, np.float32, 0.3)
    k[0, 0, :3] = [1e6, -1e6, 0.0]                          # clamped, never NaN
    ks, vs = (np.array([0.5, 3.0], np.float32), np.array([0.01, 0.002], np.float32)) \
        if scales == "head" else (0.7, 0.004)
    shape = (N, 2, P, H, D) if layout == "NHD" else (N, 2, H, P, D)
    cache = np.zeros(shape, fp8)
    batch = np.repeat(np.arange(len(lens)), lens).astype(np.int32)
    pos = np.concatenate([np.arange(n) for n in lens]).astype(np.int32)
    append_paged_kv_cache(k, v, batch, pos, cache, pages, indptr, last, layout, k_scale=ks,
                          v_scale=vs)
    got_k = _tokens(cache, pages, indptr, lens, layout, 0)
    got_v = _tokens(cache, pages, indptr, lens, layout, 1)
    assert got_k.tobytes() == quantize_ref(k, ks, fp8).tobytes()
    assert got_v.tobytes() == quantize_ref(v, vs, fp8).tobytes()
    limit = float(ml_dtypes.finfo(fp8).max)
    assert got_k[0, 0, 0].astype(np.float32) == limit and got_k[0, 0, 1].astype(np.float32) == -limit
    assert not np.isnan(got_k.astype(np.float32)).any()
    # within one fp8 step of x / scale (the reciprocal is one float32 rounding away)
    per_head = np.broadcast_to(np.asarray(ks, np.float64), (H,))[None, :, None]
    exact = np.clip(k.astype(np.float64) / per_head, -limit, limit)
    step = np.abs(exact.astype(fp8).astype(np.float64) - exact.astype(np.float32).astype(fp8)
                  .astype(np.float64))
    assert (np.abs(got_k.astype(np.float64) - exact.astype(fp8).astype(np.float64)) <= step).all()


def test_reference_quantizes_in_float32_per_head():
    rows = np.array([[[1.0, -3.0]], [[1000.0, 0.1]]], np.float32)
    got = quantize_ref(rows.astype(ml_dtypes.bfloat16), np.array([0.5], np.float32), E4M3)
    assert got.dtype == E4M3
    assert got.astype(np.float32).tolist() == [[[2.0, -6.0]], [[448.0, 0.203125]]]
    with pytest.raises(ValueError, match="scale=0.0 must be a positive finite number"):
        quantize_ref(rows, 0.0, E4M3)


def test_slot_mapping_and_block_tables_quantize_the_same_bytes(rng, target):
    lens = [6, 3]
    pages, indptr, last = _table(rng, lens)
    k, v = _rows(rng, 9, np.float16, 3.0), _rows(rng, 9, np.float16, 3.0)
    ks, vs = np.array([0.02, 0.05], np.float32), 0.01
    csr = np.zeros((N, 2, H, P, D), E4M3)
    batch = np.repeat([0, 1], lens).astype(np.int32)
    pos = np.concatenate([np.arange(n) for n in lens]).astype(np.int32)
    append_paged_kv_cache(k, v, batch, pos, csr, pages, indptr, last, "HND", k_scale=ks, v_scale=vs)
    slots = np.array([pages[indptr[b] + p // P] * P + p % P for b, p in zip(batch, pos)])
    pair = (np.zeros((N, H, P, D), E4M3), np.zeros((N, H, P, D), E4M3))
    reshape_and_cache(k, v, *pair, slots, "HND", k_scale=ks, v_scale=vs)
    stacked = np.zeros((2, N, H, P, D), E4M3)
    tables = np.full((2, 3), -1, np.int32)
    for b in range(2):
        tables[b, :indptr[b + 1] - indptr[b]] = pages[indptr[b]:indptr[b + 1]]
    append_kv_with_block_tables(k, v, stacked, tables, np.array(lens, np.int32),
                                np.array([0, 6, 9], np.int32), "HND", k_scale=ks, v_scale=vs)
    assert csr[:, 0].tobytes() == pair[0].tobytes() == stacked[0].tobytes()
    assert csr[:, 1].tobytes() == pair[1].tobytes() == stacked[1].tobytes()


@pytest.mark.parametrize("scales", ["tensor", "head"])
def test_fused_write_quantizes_and_attention_reads_back_with_the_scales(rng, target, scales):
    lens, q_lens = [9, 4, 1], [3, 4, 1]
    pages, indptr, last = _table(rng, lens)
    ks, vs = (np.array([0.03, 0.08], np.float32), np.array([0.02, 0.01], np.float32)) \
        if scales == "head" else (0.05, 0.02)
    cache = (rng.standard_normal((N, 2, P, H, D)) * 4).astype(E4M3)
    qo = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    Q = int(qo[-1])
    k, v = _rows(rng, Q, ml_dtypes.bfloat16, 2.0), _rows(rng, Q, ml_dtypes.bfloat16, 0.5)
    q = _rows(rng, Q, ml_dtypes.bfloat16, 1.0).repeat(2, axis=1)        # 4 query heads, G = 2
    fused = cache.copy()
    out = batch_prefill(q, fused, qo, indptr, pages, last, causal=True, k_scale=ks, v_scale=vs,
                        append_key=k, append_value=v)
    apart = cache.copy()
    batch = np.repeat(np.arange(3), q_lens).astype(np.int32)
    pos = np.concatenate([np.arange(n - m, n) for n, m in zip(lens, q_lens)]).astype(np.int32)
    append_paged_kv_cache(k, v, batch, pos, apart, pages, indptr, last, k_scale=ks, v_scale=vs)
    assert fused.tobytes() == apart.tobytes()
    # attention over the fp8 cache with its scales = attention over the dequantized cache
    per_head = lambda s: np.broadcast_to(np.asarray(s, np.float32), (H,))[None, None, :, None]  # noqa: E731
    wide = np.stack([apart[:, 0].astype(np.float32) * per_head(ks),
                     apart[:, 1].astype(np.float32) * per_head(vs)], axis=1)
    want = batch_prefill_ref(q, wide, qo, indptr, pages, last, causal=True)
    assert np.abs(out.astype(np.float32) - want).max() < 3e-2 * max(1.0, np.abs(want).max())
    dec = batch_decode(q[qo[1:] - 1], apart, indptr, pages, last, k_scale=ks, v_scale=vs)
    assert np.abs(dec.astype(np.float32) - want[qo[1:] - 1]).max() < 3e-2 * max(1.0, np.abs(want).max())


@pytest.mark.parametrize("kwargs,cache_dtype,error,match", [
    (dict(k_scale=0.5, v_scale=0.5), np.float32, TypeError, "into an fp8 cache"),
    (dict(k_scale=0.5), E4M3, ValueError, "both k_scale and v_scale"),
    (dict(k_scale=np.ones(3, np.float32), v_scale=1.0), E4M3, ValueError, r"\(num_kv_heads,\)"),
    (dict(k_scale=-1.0, v_scale=1.0), E4M3, ValueError, "must be a positive finite number"),
    (dict(k_scale=1.0, v_scale=np.array([0.5, 0.0], np.float32)), E4M3, ValueError,
     "v_scale=0.0 must be a positive finite number"),
    (dict(k_scale=1.0, v_scale=np.array([0.5, 1], np.int32)), E4M3, ValueError, "must be float"),
    (dict(k_scale="2", v_scale=1.0), E4M3, TypeError, "real number"),
    (dict(), E4M3, TypeError, "pass k_scale and v_scale"),
])
def test_bad_quantization_is_refused_before_any_write(rng, kwargs, cache_dtype, error, match):
    pages, indptr, last = _table(rng, [3])
    cache = np.ones((N, 2, P, H, D), cache_dtype)
    before = cache.tobytes()
    k = _rows(rng, 3, np.float32)
    with pytest.raises(error, match=match):
        append_paged_kv_cache(k, k, np.zeros(3, np.int32), np.arange(3, dtype=np.int32), cache,
                              pages, indptr, last, **kwargs)
    assert cache.tobytes() == before


def test_two_cores_quantize_the_same_bytes(rng):
    """LNC=2 (trn2): one core quantizes K, the other V, over two 128-token tiles; the fused
    write of batch_prefill gives the same cache."""
    from nki_kernels import simulate
    k = _rows(rng, 200, ml_dtypes.bfloat16, 3.0)
    v = _rows(rng, 200, ml_dtypes.bfloat16, 0.5)
    pages = rng.permutation(60)[:50].astype(np.int32)
    indptr, last = np.array([0, 50], np.int32), np.array([4], np.int32)
    batch, pos = np.zeros(200, np.int32), np.arange(200, dtype=np.int32)
    ks, vs = np.array([0.1, 0.2], np.float32), 0.3
    caches = [np.zeros((60, 2, P, H, D), E4M3) for _ in range(3)]
    with simulate.use_target("trn2"):
        append_paged_kv_cache(k, v, batch, pos, caches[0], pages, indptr, last, k_scale=ks,
                              v_scale=vs)
        append_paged_kv_cache(k, v, batch, pos, caches[1], pages, indptr, last, k_scale=ks,
                              v_scale=vs, lnc=2)
        q = _rows(rng, 200, ml_dtypes.bfloat16, 1.0)
        batch_prefill(q, caches[2], np.array([0, 200], np.int32), indptr, pages, last,
                      causal=True, k_scale=ks, v_scale=vs, append_key=k, append_value=v, lnc=2)
    assert caches[0].tobytes() == caches[1].tobytes() == caches[2].tobytes()
    assert np.count_nonzero(caches[0].view(np.uint8)) > 0
