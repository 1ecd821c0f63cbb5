"""Our views of transformers' continuous-batching cache tensor: where a layer's pages are, and
refusals when the rows do not have the documented layout."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from nki_kernels.hf.cache_views import layer_cache, page_table, token_table  # noqa: E402


class _Allocator:
    """The public attributes ``layer_cache`` reads from a transformers CacheAllocator."""

    def __init__(self, tokens, heads, dim, page, layers):
        self.cache_tensor = torch.zeros(tokens, 2, heads, dim)
        self.tokens_per_page = page
        self.layer_indices = layers


def test_fused_page_of_a_block_is_the_layers_k_then_v_page():
    # 3 layers, pages of 4 tokens: block b holds [L0 K | L0 V | L1 K | L1 V | L2 K | L2 V]
    alloc = _Allocator(tokens=48, heads=2, dim=3, page=4, layers=[5, 6, 7])
    rows = alloc.cache_tensor.view(-1, 2, 3)                 # 96 rows of H x D
    layer = layer_cache(alloc, 6)                            # the second layer of the group
    block, entry = 1, 2
    layer.fused[block * 3, 0, entry] = 1.0                   # K, fused page b * L
    layer.fused[block * 3, 1, entry] = 2.0                   # V
    k_row = block * 24 + 1 * 8 + entry                       # block stride 2LP=24, layer i at 2iP
    assert torch.all(rows[k_row] == 1.0) and torch.all(rows[k_row + 4] == 2.0)
    assert int(torch.count_nonzero(rows)) == 2 * 6
    physical = block * 24 + entry                            # HF's row, counted from layer 6's K
    assert np.all(layer.k_tokens[physical, 0] == 1.0) and np.all(layer.v_tokens[physical, 0] == 2.0)
    assert layer.slots(np.array([physical])).tolist() == [block * 3 * 4 + entry]
    assert not layer.k_tokens.flags.writeable


def test_a_v_row_is_not_a_slot():
    layer = layer_cache(_Allocator(tokens=16, heads=1, dim=2, page=4, layers=[0]), 0)
    with pytest.raises(ValueError, match="not a K row"):
        layer.slots(np.array([5]))                           # entry 5 of 8: a V row


def test_page_table_of_whole_pages():
    P = 4
    a = [0 * 8 + i for i in range(4)] + [3 * 8 + i for i in range(2)]   # pages 0, 3; 6 tokens
    b = [5 * 8 + i for i in range(4)]
    indptr, indices, last = page_table([np.array(a), np.array(b), np.array([], int)], P)
    assert indptr.tolist() == [0, 2, 3, 3]
    assert indices.tolist() == [0, 3, 5]
    assert last.tolist() == [2, 4, 0]


@pytest.mark.parametrize("rows", [[8, 9, 10, 11, 1], [1, 2, 3, 4], [0, 1, 3, 2]])
def test_rows_that_are_not_whole_pages_in_order_are_refused(rows):
    with pytest.raises(ValueError, match="not whole pages in order"):
        page_table([np.array(rows)], 4)


def test_token_table():
    indptr, indices, last = token_table([np.array([7, 3]), np.array([], int), np.array([9])])
    assert indptr.tolist() == [0, 2, 2, 3] and indices.tolist() == [7, 3, 9]
    assert last.tolist() == [1, 0, 1]
    assert {a.dtype for a in (indptr, indices, last)} == {np.dtype(np.int32)}
    big = token_table([np.array([2 ** 31 - 2], np.int64)])[1]          # int64 rows, int32 out
    assert big.dtype == np.int32 and big.tolist() == [2 ** 31 - 2]
