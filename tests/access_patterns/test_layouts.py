"""Layout builders vs NumPy fancy indexing of the same region."""

import itertools

import numpy as np
import pytest

from nki_kernels.access_patterns import PagedKVLayout, contiguous_run, page_rows, scatter_write


def _numbered_cache(N, P, H, D, layout, fused):
    """(shape, array of element numbers) of a fused 5-D or one 4-D paged cache."""
    inner = (P, H, D) if layout == "NHD" else (H, P, D)
    shape = (N, 2) + inner if fused else (N,) + inner
    return shape, np.arange(int(np.prod(shape))).reshape(shape)


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_page_rows(layout, fused):
    N, P, H, D = 3, 8, 2, 4
    shape, arr = _numbered_cache(N, P, H, D, layout, fused)
    for page, kv, start, count, head in itertools.product([0, 2], [0, 1] if fused else [0], [0, 3],
                                                           [1, 5], [None, 1]):
        block = arr[page, kv] if fused else arr[page]
        if layout == "NHD":
            region = block[start:start + count] if head is None else block[start:start + count, head]
        else:
            region = block[:, start:start + count] if head is None else block[head, start:start + count]
        ap = page_rows(layout, shape, page, start, count, kv=kv, head=head)
        np.testing.assert_array_equal(np.sort(ap.indices().ravel()), np.sort(region.ravel()))
        np.testing.assert_array_equal(ap.indices().ravel(), region.ravel())
    # NHD rows of all heads are one run; HND rows of one head are one run of count * D
    run = contiguous_run(page_rows(layout, shape, 1, 2, 3, head=None if layout == "NHD" else 0))
    assert run == 3 * H * D if layout == "NHD" else run == 3 * D


@pytest.mark.parametrize("mode", ["linear", "circular"])
def test_scatter_write_matches_onnx_semantics(mode):
    shape, axis = (3, 2, 8, 5), 2
    cache = np.arange(int(np.prod(shape))).reshape(shape)
    update = np.arange(3 * 2 * 5 * 5).reshape(3, 2, 5, 5) + 10 ** 6
    for b, w in itertools.product(range(3), range(0, 12 if mode == "circular" else 4)):
        pieces = scatter_write(shape, axis, b, w, 5, mode)
        assert len(pieces) == (2 if mode == "circular" and (w % 8) + 5 > 8 else 1)
        got = cache.copy().ravel()
        for dst, src in pieces:
            got[dst.indices().ravel()] = update.ravel()[src.indices().ravel()]
        want = cache.copy()
        for s in range(5):
            want[b, :, (w + s) % 8 if mode == "circular" else w + s] = update[b, :, s]
        np.testing.assert_array_equal(got.reshape(shape), want)


@pytest.mark.parametrize("D", [2, 1])
@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_paged_layout_token_patterns_address_the_cache(layout, fused, D):
    """start + tokens(...) reaches exactly the elements NumPy indexing gives, for K and V.
    head_dim 1 under HND: a token's heads are single elements P apart, so its contiguous run
    is one element (found by the fuzz suite: the run was taken as H)."""
    N, P, H = 4, 6, 3
    shape, arr = _numbered_cache(N, P, H, D, layout, fused)
    lay = PagedKVLayout.from_shape(shape, layout)
    assert (lay.num_pages, lay.page_size, lay.num_heads, lay.head_dim) == (N, P, H, D)
    for page, entry, kv in itertools.product(range(N), range(P), [0, 1] if fused else [0]):
        block = arr[page, kv] if fused else arr[page]
        want = block[entry] if layout == "NHD" else block[:, entry]          # [H, D]
        got = lay.token().with_offset(lay.start(page, entry, kv)).indices()
        np.testing.assert_array_equal(got.ravel(), want.ravel())
    count = P - 1
    got = lay.tokens(count).with_offset(lay.start(2, 1)).indices().reshape(count, H * D)
    block = arr[2, 0] if fused else arr[2]
    want = block[1:1 + count] if layout == "NHD" else block[:, 1:1 + count].transpose(1, 0, 2)
    np.testing.assert_array_equal(got, want.reshape(count, H * D))
    assert lay.token_run == (H * D if layout == "NHD" else D)
    assert lay.token().pattern[-1] == (1, lay.token_run)
    with pytest.raises(ValueError, match="layout"):
        PagedKVLayout.from_shape(shape, "NDH")


def test_sequence_rows_are_rows_of_every_prefix():
    outer, M, rows, inner = 3, 7, 4, 5
    arr = np.arange(outer * M * inner).reshape(outer, M, inner)
    from nki_kernels.access_patterns import sequence_rows
    ap = sequence_rows(outer, M, rows, inner).with_offset(2 * inner)        # from row 2
    np.testing.assert_array_equal(ap.indices(), arr[:, 2:2 + rows])
