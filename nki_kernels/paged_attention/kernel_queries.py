"""Queries of a work item as the stationary operands of the score matmuls.

A score matmul contracts over the head dim on partitions, so it needs Q^T [Dp, R] (Dp <= 128 rows
of the head dim). Loading Q^T straight from HBM reads one 2-byte element per DMA descriptor
(partition step 1); instead the R rows are loaded row-major (one contiguous run of D elements per
partition) and transposed on TensorE through PSUM, one transpose per 128 rows of the head dim.

NeuronCore-v2 transposes on TensorE as an fp32 matmul with the identity, where one NaN or inf
(times the identity's zeros) would reach every row of the tile. There the rows are transposed
with their non-finite elements replaced by 0, and each row's softmax state gets a per-row
``poison`` term: 0, or NaN for a row that held a non-finite element (one ScalarE sum of q * 0),
so its scores (and P, transposed on TensorE too) stay finite. From
NeuronCore-v3 the PE transpose mode is bit-exact and no poison is needed. Either way a NaN or
inf in one query head's row makes that head's output NaN and no other.

Row order of a tile (kv heads h0..h0+n-1, G query heads each, Qb query tokens from row t0 + q0):
row j*G*Qb + qi*G + g is query head (h0 + j)*G + g of token t0 + q0 + qi (decode: Qb = 1).
"""

from __future__ import annotations

from nki_kernels.backend import nisa, nl

from .kernel_load import word_view
from .kernel_softmax import rows_at, transpose_dtype


def query_pads(n, R, D, mm_dtype, engine=None):
    """Zeroed SBUF tiles [Dp, n * R] (one per 128 rows of the head dim) for ``group_queries`` to
    write its n stationaries' diagonal blocks into: made once before the device loops, each
    item slot of a loop iteration keeps its own, so their zeros are written once per launch
    instead of once per item (only the diagonal blocks change from item to item). ``engine``:
    the memsets' (GpSimd by default; the launch's callers alternate it with VectorE, both idle
    before the first item)."""
    pads = []
    for d0 in range(0, D, 128):
        pad = nl.ndarray((min(128, D - d0), n * R), mm_dtype, buffer=nl.sbuf, name="q_pad_kept")
        nisa.memset(dst=word_view(pad), value=0.0, engine=engine or nisa.engine.gpsimd)
        pads.append(pad)
    return pads


def query_block_rows(q, t0, heads, G, Qb, q0):
    """The rows of query tokens t0 + q0 .. t0 + q0 + Qb of every kv head in one DMA: SBUF
    [G * Qb, heads * D], row qi * G + g, columns h * D.. holding query head h * G + g (the rows
    of the one-kv-head tiles of a query block, side by side; ``group_queries(rows=...)``)."""
    _, HQ, D = q.shape
    rows = nl.ndarray((G * Qb, heads * D), q.dtype, buffer=nl.sbuf, name="q_block_rows")
    nisa.dma_copy(dst=rows, src=rows_at(q, [[HQ * D, Qb], [D, G], [G * D, heads], [1, D]],
                                        q0 * HQ * D, t0))
    return rows


def query_tile_rows(q, t0, n, G, Qb, tiles):
    """The rows of ``tiles`` side-by-side tiles of n kv heads (``side_by_side``) in one DMA:
    SBUF [R, tiles * D], tile t's rows (kv head j, token qi, g) in columns t * D.. holding query
    head (t * n + j) * G + g of token t0 + qi (a null item's rows are past q's: skipped)."""
    _, HQ, D = q.shape
    R = n * G * Qb
    rows = nl.ndarray((R, tiles * D), q.dtype, buffer=nl.sbuf, name="q_rows")
    nisa.dma_copy(dst=rows, src=rows_at(q, [[G * D, n], [HQ * D, Qb], [D, G], [n * G * D, tiles],
                                         [1, D]], 0, t0), oob_mode=nisa.oob_mode.skip)
    return rows


def query_rows(q, t0, h0, n, G, Qb, q0=0):
    """The [R, D] rows of ``group_queries``' tile (kv heads h0..h0+n-1, tokens t0 + q0 ..
    t0 + q0 + Qb), one DMA; a null item's rows are past q's (work.NullItems): skipped."""
    _, HQ, D = q.shape
    rows = nl.ndarray((n * G * Qb, D), q.dtype, buffer=nl.sbuf, name="q_rows")
    nisa.dma_copy(dst=rows, src=rows_at(q, [[G * D, n], [HQ * D, Qb], [D, G], [1, D]],
                                        (q0 * HQ + h0 * G) * D, t0),
                  oob_mode=nisa.oob_mode.skip)
    return rows


def group_queries(q, t0, h0, n, G, Qb, mm_dtype, q0=0, kept=None, rows=None, blocks=1):
    """Per kv head j < n of the group: Q^T tiles [Dp, R] (R = n*G*Qb) in the matmul dtype, holding
    head h0+j's rows in columns j*G*Qb..(j+1)*G*Qb and zeros elsewhere, so the per-head matmuls
    of a group accumulate into one PSUM tile. ``q`` [B, HQ, D] @ HBM; the tokens are rows
    t0 + q0 .. t0 + q0 + Qb (``t0`` a device scalar, ``q0`` the tile's first token of its block).
    Returns (pads, poison): poison [R, 1] fp32 (0, or NaN for a row with a non-finite element),
    or None where the transpose is exact. ``kept``: ``query_pads`` tiles to write into (their
    off-diagonal zeros kept from before), else fresh tiles zeroed here. ``rows``: the tile's
    rows [R, D] already loaded (``query_block_rows``), else loaded here (transposed on TensorE,
    idle while a launch sets up: by DMA, blocks of queries ran 1-2% slower, prefill 1k 457.9 ->
    468.2 us). ``blocks``: the tile's rows are that many packed requests'
    (``kernel.packed_requests``), each n / blocks kv heads: a head's stationary is
    [Dp, R / blocks], its request's rows only (``raw_scores`` writes each request's scores at
    its own partitions)."""
    _, HQ, D = q.shape
    GQ = G * Qb
    R = n * GQ
    if rows is None:
        rows = query_rows(q, t0, h0, n, G, Qb, q0)
    poison = None
    if nisa.get_nc_version() < nisa.nc_version.gen3:
        rows, poison = _finite_rows(rows)
    pads = []
    for _ in range(n):
        pads.append([])
    Rb, Hb = R // blocks, n // blocks       # a request's rows and kv heads
    for d0 in range(0, D, 128):
        dp = min(128, D - d0)
        qT_ps = nl.ndarray((dp, R), transpose_dtype(q.dtype), buffer=nl.psum, name="qT_ps")
        nisa.nc_transpose(dst=qT_ps, data=rows[:, d0:d0 + dp])
        # the n stationaries side by side in one tile, zeroed by one memset on GpSimd (VectorE
        # has the softmax), head j's columns copied onto its block's diagonal by one copy
        if kept is not None:
            pad = kept[d0 // 128]
        else:
            pad = nl.ndarray((dp, n * Rb), mm_dtype, buffer=nl.sbuf, name="q_pad")
            if n > 1:
                nisa.memset(dst=pad, value=0.0, engine=nisa.engine.gpsimd)
        # evicted by ScalarE: VectorE carries the softmax's selects and state updates
        nisa.activation(dst=pad.ap([[n * Rb, dp], [Hb * Rb, blocks], [Rb + GQ, Hb], [1, GQ]]),
                        op=nl.copy, data=qT_ps.ap([[R, dp], [Hb * GQ, blocks], [GQ, Hb],
                                                   [1, GQ]]))
        for j in range(n):
            pads[j].append(pad[:, j * Rb:(j + 1) * Rb])
    return pads, poison


# Query tiles of one kv head each whose transposes share one PSUM tile and one eviction: four
# [D, 128] bf16 transposes fill half a bank; one ScalarE copy of 4 x 128 elements a partition
# instead of four of 128 (its fixed cost paid once)
HEAD_TILES_PER_EVICTION = 4


def head_queries(rows, mm_dtype):
    """Q^T stationaries of several one-kv-head tiles (``head_major`` whole units, D <= 128,
    NeuronCore-v3+: exact transposes, no poison): ``rows`` their [R, D] query rows each; the
    tiles transposed HEAD_TILES_PER_EVICTION at a time into one PSUM tile [D, k * R] and evicted
    by one ScalarE copy into an SBUF tile [D, k * R]. Returns per tile its pads ([Dp, R]
    view), as ``group_queries``."""
    R, D = rows[0].shape
    pads = []
    for t0 in range(0, len(rows), HEAD_TILES_PER_EVICTION):
        part = rows[t0:t0 + HEAD_TILES_PER_EVICTION]
        k = len(part)
        qT_ps = nl.ndarray((D, k * R), transpose_dtype(part[0].dtype), buffer=nl.psum,
                           name="qT_ps")
        for j in range(k):
            nisa.nc_transpose(dst=qT_ps[:, j * R:(j + 1) * R], data=part[j])
        pad = nl.ndarray((D, k * R), mm_dtype, buffer=nl.sbuf, name="q_pad")
        nisa.activation(dst=pad, op=nl.copy, data=qT_ps)
        for j in range(k):
            pads.append([[pad[:, j * R:(j + 1) * R]]])
    return pads


def _finite_rows(rows):
    """(rows with non-finite elements replaced by 0, [R, 1] fp32 poison: sum of rows * 0 per
    row, 0 for a finite row and NaN otherwise)."""
    R, D = rows.shape
    poison = nl.ndarray((R, 1), nl.float32, buffer=nl.sbuf, name="q_poison")
    scratch = nl.ndarray((R, D), nl.float32, buffer=nl.sbuf, name="q_times_0")
    nisa.activation(dst=scratch, op=nl.copy, data=rows, scale=0.0, reduce_op=nl.add,
                    reduce_res=poison, reduce_cmd=nisa.reduce_cmd.reset_reduce)
    finite = nl.ndarray((R, D), nl.uint8, buffer=nl.sbuf, name="q_finite")
    nisa.tensor_scalar(dst=finite, data=scratch, op0=nl.equal, operand0=0.0)
    clean = nl.ndarray((R, D), rows.dtype, buffer=nl.sbuf, name="q_clean")
    nisa.select_reduce(dst=clean, predicate=finite, on_true=rows, on_false=0.0)
    return clean, poison
