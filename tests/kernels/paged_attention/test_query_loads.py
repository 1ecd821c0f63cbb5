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
