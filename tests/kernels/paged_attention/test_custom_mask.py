"""Custom masks (FlashInfer's flattened and bit-packed layouts) on batch_prefill and
batch_prefill_ragged, in the simulator on trn1 and trn2 against the float64 references."""

import numpy as np
import pytest

from nki_kernels import simulate
from nki_kernels.paged_attention import (batch_prefill, batch_prefill_ragged,
                                         batch_prefill_ragged_ref, batch_prefill_ref,
                                         batch_decode_kernel, packbits, segment_packbits)
from nki_kernels.paged_attention.custom_mask import (mask_table, request_masks,
                                                     with_mask_free_chunks)
from nki_kernels.paged_attention.work import TAIL_CHUNKS, query_blocks

from .conftest import assert_close
from .test_prefill import make_prefill_case


def flatten(masks):
    return np.concatenate([m.reshape(-1) for m in masks] + [np.zeros(0, bool)])


def random_masks(rng, q_lens, kv_lens, keep=0.6):
    return [rng.random((a, b)) < keep for a, b in zip(q_lens, kv_lens)]


def causal_masks(q_lens, kv_lens):
    return [np.arange(L)[None, :] < (L - n + np.arange(n) + 1)[:, None]
            for n, L in zip(q_lens, kv_lens)]


def tree_masks(rng, prefixes, drafts):
    """Draft trees: draft token i's parent is a random earlier draft (or the prefix's end); it
    sees the whole prefix, its ancestors and itself."""
    masks = []
    for L0, n in zip(prefixes, drafts):
        parent = [-1] + [int(rng.integers(-1, i)) for i in range(1, n)]
        m = np.zeros((n, L0 + n), bool)
        m[:, :L0] = True
        for i in range(n):
            j = i
            while j >= 0:
                m[i, L0 + j] = True
                j = parent[j]
        masks.append(m)
    return masks


def check(args, masks, packed=False, **options):
    q_lens = np.diff(args[2])
    kv_lens = np.array([m.shape[1] for m in masks])
    if packed:
        qk = np.concatenate([[0], np.cumsum(q_lens * kv_lens)])
        bits, indptr = segment_packbits(flatten(masks), qk, bitorder="little")
        given = {"packed_custom_mask": bits, "mask_indptr": indptr}
    else:
        given = {"custom_mask": flatten(masks)}
    out, lse = batch_prefill(*args, return_lse=True, **given, **options)
    options.pop("lnc", None)
    options.pop("append_key", None), options.pop("append_value", None)
    ref, ref_lse = batch_prefill_ref(*args, return_lse=True, **given, **options)
    assert_close(out, ref, lse, ref_lse, dtype=args[0].dtype.name)
    return out, lse


GRID = [  # q_lens, kv_lens, page_size: rows and keys straddling bytes, pages and chunks
    ([5, 1, 0, 19, 3], [40, 7, 10, 150, 3], 16),
    ([9, 13], [129, 300], 8),
    ([1, 1, 1], [17, 200, 1], 16),          # decode-only batch with masks
    ([70], [257], 128),
    ([3, 33], [600, 45], 256),
]


@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("q_lens, kv_lens, page_size", GRID, ids=str)
def test_random_masks_match_reference(rng, target, q_lens, kv_lens, page_size, layout):
    args = make_prefill_case(rng, q_lens, kv_lens, page_size, 2, 4, 64, layout=layout)
    masks = random_masks(rng, q_lens, kv_lens)
    check(args, masks)


def test_fully_masked_rows_give_zeros_and_minus_inf(rng, target):
    q_lens, kv_lens = [4, 6], [300, 9]
    args = make_prefill_case(rng, q_lens, kv_lens, 16, 2, 2, 32)
    masks = random_masks(rng, q_lens, kv_lens)
    masks[0][:, :200] = True
    masks[0][2] = False                 # a row of a block that also has mask-free chunks
    masks[1][:] = False                 # a whole request
    out, lse = check(args, masks)
    rows = [2] + list(range(4, 10))
    assert (out[rows] == 0).all() and np.isneginf(lse[rows]).all()
    assert np.isfinite(lse[[0, 1, 3]]).all()


def test_fully_masked_row_with_sinks_keeps_the_sink(rng, target):
    args = make_prefill_case(rng, [3], [20], 16, 1, 2, 32)
    masks = [np.ones((3, 20), bool)]
    masks[0][1] = False
    sinks = rng.standard_normal(2).astype(np.float32)
    out, lse = check(args, masks, sinks=sinks)
    assert (out[1] == 0).all()
    np.testing.assert_allclose(lse[1], sinks / np.log(2), rtol=1e-5)


@pytest.mark.parametrize("q_lens, kv_lens, page_size", GRID[:2] + GRID[3:], ids=str)
def test_causal_mask_equals_causal(rng, target, q_lens, kv_lens, page_size):
    kv_lens = [max(a, b) for a, b in zip(q_lens, kv_lens)]
    args = make_prefill_case(rng, q_lens, kv_lens, page_size, 2, 4, 64)
    masked = batch_prefill(*args, custom_mask=flatten(causal_masks(q_lens, kv_lens)))
    causal = batch_prefill(*args, causal=True)
    np.testing.assert_allclose(masked, causal, atol=1e-6, rtol=1e-6)


def test_mask_overrides_causal(rng, target):
    """causal=True with a mask: the mask decides (here an all-ones mask: every key)."""
    q_lens, kv_lens = [5], [5]
    args = make_prefill_case(rng, q_lens, kv_lens, 4, 1, 2, 32)
    ones = flatten([np.ones((5, 5), bool)])
    np.testing.assert_allclose(batch_prefill(*args, causal=True, custom_mask=ones),
                               batch_prefill(*args), atol=1e-6)


@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_tree_verification(rng, target, layout):
    prefixes, drafts = [100, 7, 513], [16, 8, 11]
    kv_lens = [p + d for p, d in zip(prefixes, drafts)]
    args = make_prefill_case(rng, drafts, kv_lens, 16, 2, 4, 64, layout=layout)
    check(args, tree_masks(rng, prefixes, drafts), packed=True)


@pytest.mark.parametrize("options", [
    {"logits_soft_cap": 7.0}, {"window_left": 30}, {"sm_scale": 0.3}, {"lnc": 2},
    {"sinks": "sinks"}], ids=str)
def test_options(rng, target, options):
    if options.get("lnc") == 2 and target == "trn1":
        pytest.skip("LNC=2 is a trn2 feature")
    q_lens, kv_lens = [7, 1, 20], [90, 33, 260]
    args = make_prefill_case(rng, q_lens, kv_lens, 16, 2, 4, 64)
    if options.get("sinks"):
        options = {"sinks": rng.standard_normal(8).astype(np.float32)}
    check(args, random_masks(rng, q_lens, kv_lens, 0.8), packed=True, **options)


def test_bfloat16(rng, target):
    import ml_dtypes
    q_lens, kv_lens = [6, 12], [77, 140]
    args = make_prefill_case(rng, q_lens, kv_lens, 16, 2, 4, 64, q_dtype=ml_dtypes.bfloat16,
                             kv_dtype=ml_dtypes.bfloat16)
    check(args, random_masks(rng, q_lens, kv_lens))


def test_fused_write_with_mask_equals_mask_over_written_cache(rng, target):
    q_lens, kv_lens = [4, 9], [30, 70]
    q, cache, qo, kv_indptr, kv_indices, last, layout = make_prefill_case(
        rng, q_lens, kv_lens, 16, 2, 2, 32)
    masks = random_masks(rng, q_lens, kv_lens)
    key = rng.standard_normal((13, 2, 32)).astype(np.float32)
    value = rng.standard_normal((13, 2, 32)).astype(np.float32)
    written = cache.copy()
    fused = batch_prefill(q, written, qo, kv_indptr, kv_indices, last, custom_mask=flatten(masks),
                          append_key=key, append_value=value)
    from nki_kernels.paged_kv_append import append_paged_kv_cache
    from nki_kernels.paged_cache.batch_indices import get_batch_indices_positions
    separate = cache.copy()
    batch, pos = get_batch_indices_positions(qo, np.array(kv_lens, np.int32), 13)
    append_paged_kv_cache(key, value, batch, pos, separate, kv_indices, kv_indptr, last)
    np.testing.assert_array_equal(written, separate)
    ref = batch_prefill_ref(q, separate, qo, kv_indptr, kv_indices, last,
                            custom_mask=flatten(masks))
    assert_close(fused, ref)


def test_ragged_with_mask_equals_paged(rng, target):
    q_lens, kv_lens = [5, 0, 17], [33, 4, 130]
    H, G, D = 2, 4, 64
    qo = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    kv = np.concatenate([[0], np.cumsum(kv_lens)]).astype(np.int32)
    q = rng.standard_normal((qo[-1], H * G, D)).astype(np.float32)
    k = rng.standard_normal((kv[-1], H, D)).astype(np.float32)
    v = rng.standard_normal((kv[-1], H, D)).astype(np.float32)
    masks = random_masks(rng, q_lens, kv_lens)
    out, lse = batch_prefill_ragged(q, k, v, qo, kv, custom_mask=flatten(masks), return_lse=True)
    ref, ref_lse = batch_prefill_ragged_ref(q, k, v, qo, kv, custom_mask=flatten(masks),
                                            return_lse=True)
    assert_close(out, ref, lse, ref_lse)
    paged = batch_prefill(q, (k.reshape(-1, 1, H, D), v.reshape(-1, 1, H, D)), qo, kv,
                          np.arange(kv[-1], dtype=np.int32), np.where(np.diff(kv) > 0, 1, 0)
                          .astype(np.int32), custom_mask=flatten(masks))
    np.testing.assert_allclose(out, paged, atol=1e-6)


@pytest.mark.sim_only
def test_one_compile_serves_every_mask_of_a_bucket(rng):
    q_lens, kv_lens = [6, 3], [50, 41]
    args = make_prefill_case(rng, q_lens, kv_lens, 16, 2, 4, 64)
    with simulate.use_target("trn2"):
        batch_prefill(*args, custom_mask=flatten(random_masks(rng, q_lens, kv_lens)))
        before = simulate.compile_stats(batch_decode_kernel)["compilations"]
        for keep in (0.1, 0.5, 0.9):
            check(args, random_masks(rng, q_lens, kv_lens, keep))
        assert simulate.compile_stats(batch_decode_kernel)["compilations"] == before


def test_tree_mask_helper_matches_ancestor_walk(rng):
    from nki_kernels.paged_attention import tree_mask
    parents = [-1, 0, 0, 1, -1, 4, 3]
    m = tree_mask(parents, 5)
    assert m.shape == (7, 12) and m[:, :5].all()
    assert m[6, 5:].tolist() == [True, True, False, True, False, False, True]
    assert m[5, 5:].tolist() == [False, False, False, False, True, True, False]
    with pytest.raises(ValueError, match="parents"):
        tree_mask([0], 3)


def test_packbits_match_flashinfer_documentation():
    x = np.array([1, 0, 1, 1, 0, 0, 1, 1, 1, 0, 1], bool)
    packed, indptr = segment_packbits(x, np.array([0, 4, 7, 11]), bitorder="big")
    assert [bin(b) for b in packed] == ["0b10110000", "0b100000", "0b11010000"]
    assert indptr.tolist() == [0, 1, 2, 3]
    assert bin(packbits(x[:8])[0]) == "0b10110011"
    assert packbits(np.array([1, 1, 0, 0, 0, 0, 0, 0]), bitorder="little").tolist() == [3]
    assert packbits(np.array([1, 0, 1]), bitorder="little").tolist() == [5]
    empty, ptr = segment_packbits(np.zeros(0, bool), np.array([0, 0]), "little")
    assert empty.size == 0 and ptr.tolist() == [0, 0]


@pytest.mark.parametrize("bad, rule", [
    (lambda x, idx: (np.array([0, 4, 3, 11]),), "never decrease"),
    (lambda x, idx: (np.array([0, 4, 7, 10]),), "end at len"),
    (lambda x, idx: (np.array([1, 4, 7, 11]),), "start at 0"),
    (lambda x, idx: (idx, "middle"), "bitorder"),
])
def test_segment_packbits_refuses_bad_segments(bad, rule):
    x = np.ones(11, bool)
    with pytest.raises(ValueError, match=rule):
        segment_packbits(x, *bad(x, np.array([0, 4, 7, 11])))


def test_mask_table_layout():
    """Row r * C + c holds padded row r's keys c*T.., bit k of byte j = key 8j + k."""
    masks = [np.zeros((2, 20), bool)]
    masks[0][1, [0, 9, 19]] = True
    items = query_blocks(np.array([0, 2]), np.array([20]), np.array([2]), 2, -1, False, 16)
    table = mask_table(masks, items, 2, 2, 16)
    # one chunk of 128 keys (pages of 16), then a tail's further slots' (zero) bits
    assert table.shape == (2 * TAIL_CHUNKS, 16)
    rows = table.reshape(2, TAIL_CHUNKS, 16)
    assert rows[1, 0, 0] == 1 and rows[1, 0, 1] == 2 and rows[1, 0, 2] == 8
    assert rows[0].sum() == 0 and rows[:, 1:].sum() == 0


def test_mask_free_chunks_follow_the_mask():
    """A tree over a 1000-token prefix: the prefix's whole chunks stay mask-free."""
    masks = [np.ones((8, 1008), bool)]
    masks[0][:, 1000:] = np.tril(np.ones((8, 8), bool))
    items = query_blocks(np.array([0, 63]), np.array([1008]), np.array([8]), 8, -1, False, 16)
    assert items.full_hi[0] == 7                      # non-causal: up to the last whole chunk
    masks[0][3, 500] = False
    limited = with_mask_free_chunks(items, masks, 8, 16)
    assert limited.full_lo[0] == 0 and limited.full_hi[0] == 3    # chunk 3 holds key 500


@pytest.mark.parametrize("kwargs, error, rule", [
    ({"custom_mask": np.full(18, 2, np.uint8)}, TypeError, "values other than 0 and 1"),
    ({"custom_mask": np.ones(18, np.float32)}, TypeError, "custom_mask must be a 1-D bool"),
    ({"custom_mask": np.ones((2, 5), bool)}, TypeError, "custom_mask must be a 1-D bool"),
    ({"custom_mask": np.ones(11, bool)}, ValueError, "custom_mask has 11 elements"),
    ({"packed_custom_mask": np.ones(3, np.int32)}, TypeError, "packed_custom_mask must be"),
    ({"packed_custom_mask": np.ones(4, np.uint8)}, ValueError, "packed_custom_mask has 4 bytes"),
    ({"packed_custom_mask": np.ones(4, np.uint8), "mask_indptr": np.array([0, 3, 2], np.int32)},
     ValueError, "never decrease"),
    ({"packed_custom_mask": np.ones(4, np.uint8), "mask_indptr": np.array([0, 2, 4], np.int32)},
     ValueError, "mask_indptr gives request 0 2 bytes"),
    ({"packed_custom_mask": np.ones(4, np.uint8), "mask_indptr": np.array([0, 2], np.int32)},
     ValueError, "mask_indptr"),
    ({"packed_custom_mask": np.ones(5, np.uint8), "mask_indptr": np.array([0, 1, 3], np.int32)},
     ValueError, r"mask_indptr\[-1\]=3"),
])
def test_bad_masks_refused_by_name_before_any_write(rng, kwargs, error, rule):
    """Requests of 2 x 3 and 3 x 4 keys: 18 mask bits, 1 + 2 packed bytes (per request)."""
    q, cache, qo, kv_indptr, kv_indices, last, _ = make_prefill_case(rng, [2, 3], [3, 4], 4, 1, 1,
                                                                    8)
    before = cache.copy()
    key = np.zeros((5, 1, 8), np.float32)
    with pytest.raises(error, match=rule):
        batch_prefill(q, cache, qo, kv_indptr, kv_indices, last, append_key=key,
                      append_value=key, **kwargs)
    np.testing.assert_array_equal(cache, before)


def test_integer_and_list_masks_are_taken_as_bool(rng):
    q_lens, kv_lens = [2, 3], [5, 9]
    args = make_prefill_case(rng, q_lens, kv_lens, 4, 1, 2, 8)
    flat = flatten(random_masks(rng, q_lens, kv_lens))
    want = batch_prefill(*args, custom_mask=flat)
    np.testing.assert_array_equal(batch_prefill(*args, custom_mask=flat.astype(np.uint8)), want)
    np.testing.assert_array_equal(batch_prefill(*args, custom_mask=flat.tolist()), want)


def test_request_masks_unpack_little_order():
    masks = request_masks(None, np.array([0b00000101, 0b1], np.uint8), None, [1, 1], [3, 1])
    assert masks[0].tolist() == [[True, False, True]] and masks[1].tolist() == [[True]]


def test_edges_of_the_mask_helpers():
    """A tree over no prefix, a batch of no segments, empty requests beside packed ones."""
    from nki_kernels.paged_attention import tree_mask
    m = tree_mask([-1, 0], 0)
    assert m.dtype == np.bool_ and m.tolist() == [[True, False], [True, True]]
    packed, ptr = segment_packbits(np.zeros(0, bool), np.array([0]))
    assert packed.dtype == np.uint8 and packed.size == 0 and ptr.tolist() == [0]
    packed, ptr = segment_packbits(np.ones(3, bool), np.array([0, 0, 3]), "little")
    assert ptr.dtype == np.int32 and ptr.tolist() == [0, 0, 1] and packed.tolist() == [7]
    masks = request_masks(None, np.array([5], np.uint8), np.array([0, 0, 1], np.int32),
                          [0, 1], [4, 3])
    assert masks[0].shape == (0, 4) and masks[1].tolist() == [[True, False, True]]


@pytest.mark.parametrize("kwargs, error, rule", [
    ({"packed_custom_mask": [1, 2, 3]}, TypeError, "got list"),
    ({"custom_mask": np.ones((3, 6), np.int64)}, TypeError, r"got int64 array of shape \(3, 6\)"),
    ({"custom_mask": np.ones(11, bool)}, ValueError, "add up to 18"),
    ({"packed_custom_mask": np.ones(4, np.uint8)}, ValueError, "add up to 3"),
    ({"packed_custom_mask": np.ones(3, np.uint8), "mask_indptr": np.array([0, 3], np.int32)},
     ValueError, r"mask_indptr.*batch \+ 1"),
])
def test_mask_refusals_say_what_they_got(rng, kwargs, error, rule):
    q, cache, qo, kv_indptr, kv_indices, last, _ = make_prefill_case(rng, [2, 3], [3, 4], 4, 1, 1,
                                                                    8)
    with pytest.raises(error, match=rule):
        batch_prefill(q, cache, qo, kv_indptr, kv_indices, last, **kwargs)


def test_blocks_of_a_long_request_read_their_own_rows(rng):
    """300 queries of one request make several work items; each item's mask rows start at its
    first query (q0 > 0), and the request's other blocks are not confused with them."""
    q_lens, kv_lens = [300, 2], [420, 9]
    args = make_prefill_case(rng, q_lens, kv_lens, 16, 2, 4, 32)
    masks = random_masks(rng, q_lens, kv_lens, 0.7)
    masks[0][:, :256] = True                      # whole chunks, mask-free in some blocks
    masks[0][250, 100] = False                    # ... but not in the block of query 250
    with simulate.use_target("trn2"):
        check(args, masks)


@pytest.mark.parametrize("lnc", [1, 2])
def test_rows_that_see_keys_in_only_some_items_of_their_request(rng, target, lnc):
    """A request whose keys span several work items (masked chunks and mask-free blocks, their
    states chained and merged through the scratch, under LNC=2 split between the cores): rows
    that see keys only in its first chunk, only in its last, in none, and everywhere."""
    if lnc == 2 and target == "trn1":
        pytest.skip("LNC=2 is trn2's")
    q_lens, kv_lens = [8, 8], [1100, 700]
    args = make_prefill_case(rng, q_lens, kv_lens, 16, 4, 8, 16)      # two score tiles
    masks = [np.ones((q, k), bool) for q, k in zip(q_lens, kv_lens)]
    masks[0][0, 128:] = False           # first chunk only
    masks[0][1, :1024] = False          # last chunk only
    masks[0][2] = False                 # nothing
    masks[1][3, :5] = False
    masks[1][4, 600:] = False
    masks[1][5] = False
    out, lse = check(args, masks, lnc=lnc)
    assert (out[[2, 13]] == 0).all() and np.isneginf(lse[[2, 13]]).all()
    assert np.isfinite(out).all() and np.isfinite(lse[[0, 1, 3, 8, 11, 12]]).all()
