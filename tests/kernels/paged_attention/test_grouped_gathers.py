"""Mask-free blocks on NeuronCore-v3+ gather several consecutive tokens per partition
(kernel_load.group_size) and fold them in one softmax step; the tokens' order inside a step is
not the sequence order, so layouts, page sizes, head dims and dtypes must all land each head's
columns right. Long requests make blocks of 32, 8, 4, 2 and single chunks occur."""

import ml_dtypes
import numpy as np
import pytest

from nki_kernels import simulate
from nki_kernels.paged_attention import batch_decode, batch_decode_ref
from nki_kernels.paged_attention.kernel_cursor import Geometry
from nki_kernels.paged_attention.kernel_load import gather_layout, group_size, step_chunks

from .conftest import assert_close, make_decode_case


def _gathers(trace, H, D):
    """(rows, tokens per partition) of each K/V load's SBUF destination: indirect gathers (v3+),
    or page DMAs (v2: K and V of a fused cache in one, counted once)."""
    out = []
    for e in trace:
        dst = e.operands[0]
        if (e.op != "dma_copy" or dst.buffer != "sbuf" or dst.dtype == "int32"
                or e.operands[1].tensor == "q" or dst.shape[1] % (H * D)):
            continue
        if any(o.indirect == "vector" for o in e.operands) or any(
                o.indirect == "scalar" for o in e.operands[1:]) and dst.shape[1] >= H * D:
            out.append((dst.shape[0], dst.shape[1] // (H * D)))
    return out


# mask-free chunks (pages <= 128): 32 + 2 and a masked tail, 8 + 4 + 2 + 1, 2 + 1 and a masked
# tail: every block size occurs
LENS = [34 * 128 + 5, 15 * 128, 3 * 128 + 77]

# Grouped gathers are NeuronCore-v3+'s: trn1 runs the same cases through its page DMAs, the
# slowest to simulate, so its grid is the slow run's (`-m slow`; test_decode covers trn1's path)
TARGETS = pytest.mark.parametrize("target", ["trn2", pytest.param("trn1", marks=pytest.mark.slow)],
                                  indirect=True)


@pytest.mark.sim_only
@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("page_size, H, D", [(16, 8, 128), (2, 2, 64), (48, 3, 256), (128, 1, 32),
                                             (1, 2, 64)])
@pytest.mark.parametrize("fused", [True, False])
@TARGETS
def test_grouped_gathers_match_reference(rng, target, layout, page_size, H, D, fused):
    lens = [n if page_size != 48 else n - n % 96 + 50 for n in LENS]
    args = make_decode_case(rng, lens, page_size, H, 4, D, layout=layout, fused=fused)
    out, lse = batch_decode(*args, return_lse=True)
    loads = _gathers(simulate.last_trace(), H, D)
    ref, ref_lse = batch_decode_ref(*args, return_lse=True)
    assert_close(out, ref, lse, ref_lse)
    T = 128 if page_size != 48 else 96
    limit = 8192 if layout == "NHD" or H == 1 else 32768     # fp32 K bytes per partition
    expected = 1                     # a power of two dividing P and 32 chunks, K within the limit
    while page_size % (2 * expected) == 0 and 2 * expected * H * D * 4 <= limit and expected < 32:
        expected *= 2
    per_load = 2 if target == "trn1" and fused else 1      # K and V in one page DMA
    widest = max(c for _, c in loads)
    assert widest == expected * per_load
    if target == "trn2":                                    # gathers fill every partition
        assert all(r == T for r, _ in loads)
    else:                                                   # a page on P / group partitions
        assert (page_size // expected, widest) in loads


@pytest.mark.sim_only
@pytest.mark.parametrize("kv_dtype", [ml_dtypes.bfloat16, ml_dtypes.float8_e4m3fn])
@pytest.mark.parametrize("fused", [True, False])
@TARGETS
def test_grouped_gathers_low_precision(rng, target, kv_dtype, fused):
    """bf16 and fp8 caches (fp8 V converted for the matmul after the grouped load: a tile of its
    own, or the V half of a fused page load on trn1)."""
    q_dtype = ml_dtypes.bfloat16
    args = make_decode_case(rng, LENS, 16, 2, 4, 128, q_dtype=q_dtype, kv_dtype=kv_dtype,
                            fused=fused)
    out = batch_decode(*args)
    loads = _gathers(simulate.last_trace(), 2, 128)
    # a page of 16 tokens per partition (<= 8 KiB), folded in 4 steps of 4 chunks
    assert max(c for _, c in loads) == (32 if target == "trn1" and fused else 16)
    assert_close(out, batch_decode_ref(*args), dtype=np.dtype(kv_dtype).name)


def test_group_size_rules():
    def geo(P, H, D, pattern):
        return Geometry(min(128, 128 // P * P) if P <= 128 else 128, P, 0, H, D, H, pattern)

    nhd = geo(16, 8, 128, ((1, 8 * 128),))
    assert group_size(nhd, 32, 2) == 4          # 4 x 2 KiB fills the 8 KiB tile
    assert group_size(nhd, 32, 4) == 2          # fp32: 4 KiB per token
    assert group_size(nhd, 2, 2) == 2           # a block of 2 chunks
    assert group_size(nhd, 1, 2) == 1
    assert group_size(geo(2, 8, 128, ((1, 1024),)), 32, 2) == 2     # tokens stay inside a page
    assert group_size(geo(256, 8, 128, ((1, 1024),)), 32, 2) == 1   # pages over 128: chunk-wise
    hnd = geo(16, 8, 128, ((16 * 128, 8), (1, 128)))
    assert group_size(hnd, 32, 2) == 16         # a run per head: 32 KiB tiles, a page each
    assert group_size(hnd, 32, 4) == 8
    assert [step_chunks(nhd, g) for g in (1, 2, 4, 16)] == [1, 2, 4, 4]   # <= 512 keys per step
    assert step_chunks(geo(48, 8, 128, ((1, 1024),)), 16) == 4    # 96-token chunks: 4 x 96 keys
    assert step_chunks(geo(16, 8, 128, ((1, 1024),))._replace(T=160), 8) == 2   # a divisor of 8
    levels, token_cols, head_cols, v_cols = gather_layout(hnd._replace(entry_stride=1), 4)
    assert levels == [[16 * 128, 8], [128, 4], [1, 128]]       # one run of 4 tokens per head
    assert (token_cols, head_cols, v_cols) == (128, 512, 0)
    levels, token_cols, head_cols, v_cols = gather_layout(nhd._replace(entry_stride=8), 4)
    assert levels == [[1024, 4], [1, 1024]] and (token_cols, head_cols) == (1024, 128)
    # a fused cache's V one page of K later: K and V runs per partition, V after all K
    levels, token_cols, head_cols, v_cols = gather_layout(nhd._replace(entry_stride=8), 4,
                                                          16 * 1024)
    assert levels == [[16 * 1024, 2], [1024, 4], [1, 1024]]
    assert (token_cols, head_cols, v_cols) == (1024, 128, 4 * 1024)
    levels, token_cols, head_cols, v_cols = gather_layout(hnd._replace(entry_stride=1), 4,
                                                          16 * 1024)
    assert levels == [[16 * 1024, 2], [16 * 128, 8], [128, 4], [1, 128]]
    assert (token_cols, head_cols, v_cols) == (128, 512, 4 * 1024)
