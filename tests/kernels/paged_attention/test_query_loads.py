"""Queries reach the score matmuls as Q^T made on TensorE from row-major loads: every DMA reading
``q`` moves contiguous head-dim runs, one per row and kv head (a transposed DMA pattern would move
one element per descriptor), and the results match the reference for head dims over 128, several kv heads
per tile, blocks of query tokens and 16-bit queries, on trn1 (fp32 PSUM transposes) and trn2."""

import ml_dtypes
import numpy as np
import pytest

from nki_kernels import simulate
from nki_kernels.paged_attention import batch_decode, batch_decode_ref
from nki_kernels.paged_attention import batch_prefill
from nki_kernels.paged_attention.reference import batch_prefill_ref

from .conftest import assert_close, make_decode_case
from .test_prefill import make_prefill_case


def _q_loads(trace, D, itemsize):
    loads = [e for e in trace if e.op == "dma_copy" and e.operands[1].tensor == "q"]
    assert loads, "no DMA reads q"
    for e in loads:              # runs of one head's D elements: a row, or a row per kv head
        rows = e.operands[0].shape[0]
        assert e.dma_runs % rows == 0 and e.dma_bytes == e.dma_runs * D * itemsize, (
            e.dma_runs, e.dma_bytes)
    return loads


@pytest.mark.sim_only
@pytest.mark.parametrize("H, G, D", [(3, 4, 64), (2, 2, 256), (1, 8, 128)])
@pytest.mark.parametrize("q_dtype", [np.float32, ml_dtypes.bfloat16])
def test_decode_queries_load_row_major(rng, target, H, G, D, q_dtype):
    args = make_decode_case(rng, [5, 300, 129], 16, H, G, D, q_dtype=q_dtype)
    out = batch_decode(*args)
    _q_loads(simulate.last_trace(), D, np.dtype(q_dtype).itemsize)
    dtype = "float32" if q_dtype is np.float32 else "bfloat16"
    assert_close(out, batch_decode_ref(*args), dtype=dtype)


@pytest.mark.sim_only
@pytest.mark.parametrize("H, G, D", [(2, 4, 64), (1, 2, 160)])
def test_prefill_queries_load_row_major(rng, target, H, G, D):
    args = make_prefill_case(rng, [40, 33, 17], [40, 200, 300], 16, H, G, D)
    out, lse = batch_prefill(*args, return_lse=True)
    loads = _q_loads(simulate.last_trace(), D, 4)
    assert max(e.operands[0].shape[0] for e in loads) > H * G      # blocks of query tokens
    ref, ref_lse = batch_prefill_ref(*args, return_lse=True)
    assert_close(out, ref, lse, ref_lse)


@pytest.mark.sim_only
@pytest.mark.parametrize("H, D", [(5, 64), (2, 128)])
@pytest.mark.parametrize("q_dtype", [np.float32, ml_dtypes.bfloat16])
def test_whole_unit_query_transposes_share_evictions(rng, target, H, D, q_dtype):
    """Whole units (blocks of more than 16 queries, one kv head a tile) transpose their tiles'
    queries four to a PSUM tile on NeuronCore-v3+ and evict each four by one copy: 5 kv heads x
    2 query tiles take copies of 4, 4 and 2 tiles. The results match the reference; trn1 keeps
    one transpose and copy a tile (its transposes go through fp32 matmuls)."""
    G = 4
    args = make_prefill_case(rng, [64, 40], [300, 41], 16, H, G, D, q_dtype=q_dtype)
    out, lse = batch_prefill(*args, return_lse=True)
    trace = simulate.last_trace()
    copies = [e for e in trace if e.op == "activation" and e.operands[1].tensor == "qT_ps"]
    transposes = [e for e in trace if e.op == "nc_transpose" and e.operands[0].tensor == "qT_ps"]
    widths = sorted({e.free_elems for e in copies})
    tiles = 2 * H                        # 64 queries: two tiles of 32 a kv head, per unit
    if target == "trn2":
        assert len(transposes) == 2 * tiles                     # two units
        assert widths == sorted({min(4, tiles - k) * 128 for k in range(0, tiles, 4)}), widths
        assert len(copies) == 2 * -(-tiles // 4)
    else:
        assert widths == [128] and len(copies) == len(transposes)
    ref, ref_lse = batch_prefill_ref(*args, return_lse=True)
    dtype = "float32" if q_dtype is np.float32 else "bfloat16"
    assert_close(out, ref, lse, ref_lse, dtype=dtype)
