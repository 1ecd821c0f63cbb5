"""FlashInfer's ragged-KV and multi-level cascade layouts, on trn1 and trn2: each against its
float64 reference written from the definition, ragged against paged over the same keys, cascade
against flat attention over the concatenated levels; bad tables refused by name."""

import numpy as np
import pytest

from nki_kernels.paged_attention import (batch_prefill, batch_prefill_ragged,
                                         batch_prefill_ragged_ref, batch_prefill_ref,
                                         cascade_attention, cascade_attention_ref)
from nki_kernels.paged_attention.ragged import ragged_pages

from .conftest import assert_close


def _ragged(rng, q_lens, kv_lens, H=2, G=2, D=16, pad=0):
    qo = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    kv = np.concatenate([[0], np.cumsum(kv_lens)]).astype(np.int32)
    q = rng.standard_normal((int(qo[-1]), H * G, D)).astype(np.float32)
    k = rng.standard_normal((int(kv[-1]) + pad, H, D)).astype(np.float32)
    v = rng.standard_normal((int(kv[-1]) + pad, H, D)).astype(np.float32)
    return q, k, v, qo, kv


@pytest.mark.parametrize("q_lens, kv_lens", [([3, 1, 7], [5, 129, 7]), ([16, 32], [16, 48]),
                                             ([0, 2], [0, 300])], ids=str)
@pytest.mark.parametrize("causal", [False, True])
def test_ragged_matches_its_reference(rng, target, q_lens, kv_lens, causal):
    q, k, v, qo, kv = _ragged(rng, q_lens, kv_lens)
    out, lse = batch_prefill_ragged(q, k, v, qo, kv, causal=causal, return_lse=True)
    ref, ref_lse = batch_prefill_ragged_ref(q, k, v, qo, kv, causal=causal, return_lse=True)
    assert_close(out, ref, lse, ref_lse)


def test_ragged_options_and_page_choice(rng, target):
    q, k, v, qo, kv = _ragged(rng, [4, 8], [32, 64], pad=3)      # rows past kv_indptr[-1]
    assert ragged_pages(kv, k.shape[0]) == 1
    options = dict(causal=True, logits_soft_cap=7.0, window_left=10,
                   sinks=np.linspace(-1, 1, 4).astype(np.float32), sm_scale=0.3)
    assert_close(batch_prefill_ragged(q, k, v, qo, kv, **options),
                 batch_prefill_ragged_ref(q, k, v, qo, kv, **options))
    assert ragged_pages(kv, 96) == 32


def test_ragged_equals_paged_over_the_same_keys(rng, target):
    """The same keys as a paged cache (pages of 4, shuffled) give the same attention."""
    q, k, v, qo, kv = _ragged(rng, [3, 5], [10, 21])
    P, lens = 4, np.diff(kv)
    pages = -(-lens // P)
    order = rng.permutation(int(pages.sum())).astype(np.int32)
    cache = np.zeros((int(pages.sum()), 2, P, 2, 16), np.float32)
    indices, at = [], 0
    for b in range(2):
        for j in range(pages[b]):
            page = order[at]
            rows = slice(kv[b] + j * P, min(kv[b + 1], kv[b] + (j + 1) * P))
            n = rows.stop - rows.start
            cache[page, 0, :n], cache[page, 1, :n] = k[rows], v[rows]
            indices.append(page)
            at += 1
    indptr = np.concatenate([[0], np.cumsum(pages)]).astype(np.int32)
    last = (lens - (pages - 1) * P).astype(np.int32)
    paged = batch_prefill(q, cache, qo, indptr, np.array(indices, np.int32), last, causal=True)
    assert_close(batch_prefill_ragged(q, k, v, qo, kv, causal=True), paged)


def test_ragged_refusals(rng):
    q, k, v, qo, kv = _ragged(rng, [2], [4])
    with pytest.raises(ValueError, match=r"kv_indptr\[-1\]=4 exceeds the 3 rows of k / v"):
        batch_prefill_ragged(q, k[:3], v[:3], qo, kv)
    with pytest.raises(ValueError, match="k .* and v .* must match"):
        batch_prefill_ragged(q, k, v[:, :1], qo, kv)
    with pytest.raises(ValueError, match=r"qo_indptr\[-1\]=2 must equal q's rows \(1\)"):
        batch_prefill_ragged(q[:1], k, v, qo, kv)
    with pytest.raises(ValueError, match="causal: request 0 has 5 queries"):
        batch_prefill_ragged(np.zeros((5, 4, 16), np.float32), k, v,
                             np.array([0, 5], np.int32), kv, causal=True)


def _shared_prefix_case(rng, layout, shared=37, privates=(5, 12, 1), q_lens=(2, 3, 1), P=4,
                        H=2, G=2, D=16):
    """A cache with one shared prefix and a private tail per request, as two levels."""
    shared_pages = -(-shared // P)
    private_pages = [-(-n // P) for n in privates]
    N = shared_pages + sum(private_pages) + 2
    shape = (N, 2, P, H, D) if layout == "NHD" else (N, 2, H, P, D)
    cache = rng.standard_normal(shape).astype(np.float32)
    order = rng.permutation(N).astype(np.int32)
    top = order[:shared_pages]
    rest = np.split(order[shared_pages:shared_pages + sum(private_pages)],
                    np.cumsum(private_pages)[:-1])
    Q = sum(q_lens)
    q = rng.standard_normal((Q, H * G, D)).astype(np.float32)
    qo1 = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    levels = (
        [np.array([0, Q], np.int32), qo1],
        [np.array([0, shared_pages], np.int32),
         np.concatenate([[0], np.cumsum(private_pages)]).astype(np.int32)],
        [top, np.concatenate(rest).astype(np.int32)],
        [np.array([(shared - 1) % P + 1], np.int32),
         np.array([(n - 1) % P + 1 for n in privates], np.int32)])
    flat = (np.concatenate([[0], np.cumsum([shared_pages + p for p in private_pages])])
            .astype(np.int32),
            np.concatenate([np.concatenate([top, r]) for r in rest]).astype(np.int32))
    return q, cache, levels, flat, qo1


@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("causal", [False, True])
def test_cascade_matches_its_reference(rng, target, layout, causal):
    q, cache, levels, _, _ = _shared_prefix_case(rng, layout, shared=36)
    out, lse = cascade_attention(q, cache, *levels, layout, causal=causal, return_lse=True)
    ref, ref_lse = cascade_attention_ref(q, cache, *levels, layout, causal=causal,
                                         return_lse=True)
    assert_close(out, ref, lse, ref_lse)


def test_cascade_equals_flat_attention_over_the_concatenated_pages(rng, target):
    """With the shared prefix a whole number of pages, the flat page table of each request
    (shared pages then its own) is the concatenation: flat batch_prefill gives the same."""
    q, cache, levels, flat, qo1 = _shared_prefix_case(rng, "NHD", shared=36)
    last = levels[3][1]
    options = dict(causal=True, logits_soft_cap=9.0, sinks=np.array([0.5, -1, 0, 2], np.float32))
    want = batch_prefill_ref(q, cache, qo1, *flat, last, **options)
    assert_close(cascade_attention(q, cache, *levels, **options), want)
    assert_close(cascade_attention_ref(q, cache, *levels, **options), want)


def test_cascade_refusals(rng):
    q, cache, levels, _, _ = _shared_prefix_case(rng, "NHD")
    bad = [list(x) for x in levels]
    bad[0][0] = np.array([0, 2, 6], np.int32)         # 2 is not a boundary of level 1 ([0,2,5,6])
    bad[0][1] = np.array([0, 3, 5, 6], np.int32)
    with pytest.raises(ValueError, match=r"qo_indptr_arr\[0\] boundary 2 is not a boundary of "
                                         r"level 1"):
        cascade_attention(q, cache, *bad)
    with pytest.raises(ValueError, match="kv_indices_arr has 1 levels but qo_indptr_arr has 2"):
        cascade_attention(q, cache, levels[0], levels[1], levels[2][:1], levels[3])
    with pytest.raises(TypeError, match="qo_indptr_arr must be a non-empty list"):
        cascade_attention(q, cache, [], *levels[1:])
