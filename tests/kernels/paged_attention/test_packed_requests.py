"""Packed static passes: a decode static pass puts several requests in one tile of score rows
(work.static_pack: each request's rows a multiple of 32 partitions, its scores written at its
own partition offset). Checked against the reference, and for isolation: nothing one request
holds (NaN, inf, no keys) reaches another request of its tile."""

import numpy as np
import pytest

from nki_kernels import simulate
from nki_kernels.buckets import bucket
from nki_kernels.paged_attention import batch_decode, batch_decode_ref, work

from .conftest import assert_close
from .test_serving_shape import FixedCache

H, G, D = 8, 4, 32                      # 32 score rows a request: four requests a tile


def _packed(lens, cores):
    return work.static_pack(work.static_core_rows(bucket(len(lens)), cores), H, G)


def test_the_pack_fills_128_partitions_with_whole_requests():
    assert work.static_pack(8, 8, 4) == 4 and work.static_pack(2, 8, 4) == 2
    assert work.static_pack(6, 8, 4) == 2 and work.static_pack(1, 8, 4) == 1
    assert work.static_pack(8, 8, 8) == 2 and work.static_pack(8, 16, 8) == 1
    assert work.static_pack(8, 2, 4) == 1            # 8 rows a request: not a legal offset
    assert work.static_pack(8, 8, 4, mm_bytes=4) == 4
    assert work.static_pack(8, 16, 4, mm_bytes=4) == 2
    assert work.static_pack(8, 32, 2, mm_bytes=4) == 1   # its stationaries past the budget


@pytest.mark.parametrize("lens, cores, options", [
    ([70, 300, 5, 129, 1, 700, 33, 256], 1, {}),
    ([70, 300, 5, 129, 1, 700, 33, 256], 2, {}),
    ([40, 200, 900, 17], 1, dict(window_left=100)),
    ([40, 200, 300, 17], 1, dict(logits_soft_cap=30.0)),
    ([511, 16, 300], 2, dict(sinks=True)),
    ([128, 256, 384, 512], 1, dict(sm_scale=2.0))])
def test_packed_rows_match_the_reference(rng, lens, cores, options):
    cache = FixedCache(rng, pages=400, H=H, G=G, D=D)
    q, kv, indptr, pages, last, layout = cache.step(lens)
    if options.pop("sinks", False):
        options["sinks"] = rng.standard_normal(H * G).astype(np.float32)
    assert _packed(lens, cores) > 1
    with simulate.use_target("trn2"):
        out, lse = batch_decode(q, kv, indptr, pages, last, layout, return_lse=True, lnc=cores,
                                **options)
        assert not simulate.last_trace().loops
    ref, ref_lse = batch_decode_ref(q, kv, indptr, pages, last, layout, return_lse=True,
                                    **options)
    assert_close(out, ref, lse, ref_lse)


@pytest.mark.parametrize("bad", [np.nan, np.inf])
@pytest.mark.parametrize("part", [0, 1])            # K or V
def test_a_non_finite_cache_entry_stays_in_its_request(rng, bad, part):
    """A NaN or inf in one request's keys or values (a valid position) leaves the other
    requests of its tile exact: no product crosses requests."""
    lens = [300, 120, 64, 200]
    cache = FixedCache(rng, pages=200, H=H, G=G, D=D)
    q, kv, indptr, pages, last, layout = cache.step(lens)
    kv = kv.copy()
    kv[pages[indptr[1] + 50 // cache.P], part, 50 % cache.P, 3, 7] = bad   # request 1, key 50
    assert _packed(lens, 1) == 4
    with simulate.use_target("trn2"):
        out = batch_decode(q, kv, indptr, pages, last, layout)
        assert not simulate.last_trace().loops
    ref = batch_decode_ref(q, kv, indptr, pages, last, layout)
    others = [0, 2, 3]
    assert np.isfinite(out[others]).all()
    np.testing.assert_allclose(out[others], ref[others], rtol=2e-5, atol=2e-5)
    assert not np.isfinite(out[1]).all()


def test_requests_without_keys_beside_full_ones(rng):
    """Zero-length requests share a tile with requests whose leading slots are full (their V is
    not zeroed there): out 0 and LSE -inf for them, the others exact."""
    lens = [600, 0, 700, 0, 650, 640, 0, 900]
    cache = FixedCache(rng, pages=400, H=H, G=G, D=D)
    q, kv, indptr, pages, last, layout = cache.step(lens)
    with simulate.use_target("trn2"):
        out, lse = batch_decode(q, kv, indptr, pages, last, layout, return_lse=True)
        assert not simulate.last_trace().loops
    ref, ref_lse = batch_decode_ref(q, kv, indptr, pages, last, layout, return_lse=True)
    assert (out[[1, 3, 6]] == 0).all() and np.isneginf(lse[[1, 3, 6]]).all()
    assert_close(out, ref, lse, ref_lse)


@pytest.mark.parametrize("q_dtype, kv_dtype, layout", [
    ("float16", "float16", "NHD"), ("bfloat16", "bfloat16", "HND"),
    ("bfloat16", "float8_e5m2", "NHD"), ("float32", "bfloat16", "NHD")])
def test_packed_rows_in_each_dtype_and_layout(rng, q_dtype, kv_dtype, layout):
    """The cache's dtypes and layouts (K^T gathered transposed, or made on TensorE from a
    packed tile's several requests' chunks), one tolerance per dtype."""
    import ml_dtypes
    from .conftest import make_decode_case
    qd, kd = (np.dtype(getattr(ml_dtypes, n, None) or n) for n in (q_dtype, kv_dtype))
    lens = [100, 300, 50, 700, 17, 256, 129, 1]
    args = make_decode_case(rng, lens, 16, H, G, D, q_dtype=qd, kv_dtype=kd, layout=layout)
    assert _packed(lens, 1) == 4
    with simulate.use_target("trn2"):
        out = batch_decode(*args)
        assert not simulate.last_trace().loops
    assert_close(out, batch_decode_ref(*args), dtype=kv_dtype if kv_dtype != "float32" else q_dtype)
