"""How far a softmax step's end lags its begin (kernel_items.end_lag): P^T by DMA transpose
waits ~1 us, which the lag hides behind the next units' exponentials."""

from types import SimpleNamespace

import pytest

from nki_kernels.paged_attention import kernel_items


def _step(tiles, dma_pT=True, heads=8, head_dim=128, k_bytes=2):
    return SimpleNamespace(tiles=[(0, 1, 0)] * tiles, dma_pT=dma_pT, D=head_dim,
                           k_bytes=k_bytes, geo=SimpleNamespace(H=heads))


@pytest.mark.parametrize("tiles, lag", [(2, 8), (16, 8), (32, 8), (33, 4), (64, 4)])
def test_steps_of_few_tiles_lag_more_units(tiles, lag):
    """Units of up to 128 queries of a Llama-3-8B layer (32 tiles a step) lag
    DMA_PT_LAG_FEW units; wider steps, whose units' exponentials take longer, DMA_PT_LAG."""
    assert kernel_items.end_lag(_step(tiles), 1) == lag


def test_p_transposed_on_tensor_engine_lags_one_unit_and_large_v_tiles_none():
    assert kernel_items.end_lag(_step(16, dma_pT=False), 1) == 1
    assert kernel_items.end_lag(_step(16), 16) == 0          # 16 tokens x 8 x 128 x 2 B
