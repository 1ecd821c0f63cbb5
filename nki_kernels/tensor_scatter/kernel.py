"""TensorScatter-24 as an in-place NKI kernel that moves only the update's bytes.

Dimensions:  B batch, O = prod(shape[:axis]) prefixes (O/B per batch), M max_seq, S seq_len,
             I = prod(shape[axis+1:]) elements after the sequence axis (as 1/2/4-byte words)
Device view: cache [O, M, I] @ HBM (written in place), update [O, S, I] @ HBM, w [B, 1] int32
             (write indices, already reduced modulo M in circular mode).
Paths:
  seq_len 1 (decode), NeuronCore-v3+: one HBM->HBM indirect DMA for up to 128 batches, the
      fewest consecutive prefixes of one batch per partition that fit (row index o * M + w[b]
      computed on device, so only for O * M < 2**24 rows, where the fp32 ALU is exact; larger
      caches take the linear path), whatever the mode.
Patterns come from ``access_patterns.pairs`` ([outer, rows, inner] of a sequence axis, permuted
and tiled), the list form of the ``AccessPattern`` builders: NKI compiles only classes on
NKIObject, so kernel code builds lists, not ``AccessPattern`` values. The kernel's Python is
the front-end's subset (no comprehensions, lambdas, tuple loop targets or raise:
``NKI_SIM_SUBSET=strict``).
  linear (all targets): one HBM->HBM DMA per batch; the destination pattern covers the batch's
      O/B prefixes x S rows x I words and starts at row w[b] through ``scalar_offset``.
  circular, NeuronCore-v3+ (trn2): rows land at (w[b] + s) mod M, which is not affine in s, so the
      update is staged in SBUF with s on partitions (<= 128 per tile) and scattered with one
      indirect DMA (``vector_offset``) per tile; the row index is computed on device
      (iota + w[b] - M * (iota + w[b] >= M)); rows wider than the 64 KiB staging budget go in
      column pieces, so no row width overflows SBUF.
  circular, NeuronCore-v2 (trn1, no indirect DMA): one HBM->HBM DMA per (batch, s) whose
      ``scalar_offset`` row (w[b] + s) mod M is computed on device.
A write that wraps would be two static patterns if w were known at trace time; it is runtime data
(a device tensor on Trainium), so the split is done per row instead.
"""

from __future__ import annotations

from nki_kernels.access_patterns.pairs import permute_pairs, sequence_rows_pairs, tile_pairs
from nki_kernels.backend import nki, nisa, nl
from nki_kernels.kernel_dtypes import dtype_bytes

P_MAX = 128
SBUF_TILE_BYTES = 64 * 1024          # staging budget per partition for the circular path
ROW_LIMIT = 2 ** 24                  # row indices computed on VectorE (fp32 ALU) are exact below


def _rows(outer, seq, rows, inner):
    """``rows`` rows of each of ``outer`` prefixes of a [outer, seq, inner] tensor."""
    return sequence_rows_pairs(outer, seq, rows, inner)


def _column_pieces(outer, seq, rows, inner, cols):
    """(pattern, offset) pairs: rows on partitions, then prefixes, then ``cols``-element pieces
    of a row (the last may be shorter)."""
    return tile_pairs(permute_pairs(sequence_rows_pairs(outer, seq, rows, inner), [1, 0, 2]), 2,
                      cols)


def _prefixes_per_partition(per_batch, O):
    """The fewest consecutive prefixes of one batch per partition that divide its ``per_batch``
    and fit all ``O`` prefixes on <= 128 partitions (``per_batch`` when none does)."""
    for d in range(1, per_batch + 1):
        if per_batch % d == 0 and O // d <= P_MAX:
            return d
    return per_batch


@nki.jit
def tensor_scatter_kernel(cache, update, w, batch, circular):
    """In place: cache[o, (w[b] + s) (mod M), :] = update[o, s, :] for o of batch b = o // (O/B).

    Returns ``cache`` (an output aliasing the input, so a lazy torch-xla graph keeps the call)."""
    O, M, I = cache.shape
    S = update.shape[1]
    per_batch = O // batch
    if S == 1 and nisa.get_nc_version() >= 3 and O * M < ROW_LIMIT:
        _single_row_indirect(cache, update, w, batch, per_batch)
    elif not circular:
        _linear(cache, update, w, batch, per_batch)
    elif nisa.get_nc_version() >= 3:
        _circular_indirect(cache, update, w, batch, per_batch)
    else:
        _circular_rows(cache, update, w, batch, per_batch)
    return cache


def _linear(cache, update, w, batch, per_batch):
    O, M, I = cache.shape
    S = update.shape[1]
    for b0 in range(0, batch, P_MAX):
        nb = min(P_MAX, batch - b0)
        w_sb = nl.ndarray((nb, 1), nl.int32, buffer=nl.sbuf, name="w_sb")
        nisa.dma_copy(dst=w_sb, src=w[b0:b0 + nb, :])
        for b in range(b0, b0 + nb):
            dst = cache.ap(_rows(per_batch, M, S, I), offset=b * per_batch * M * I,
                           scalar_offset=w_sb[b - b0:b - b0 + 1, 0:1], indirect_dim=1)
            src = update.ap(_rows(per_batch, S, S, I), offset=b * per_batch * S * I)
            nisa.dma_copy(dst=dst, src=src)


def _single_row_indirect(cache, update, w, batch, per_batch):
    """S == 1 (decode): row w[b] of every prefix of batch b, HBM to HBM by indirect DMA (no
    staging): partition p holds k consecutive prefixes of one batch (k the smallest divisor of
    O/B that fits all prefixes on <= 128 partitions, so one DMA spreads over all DMA engines when
    batch <= 128; else k = O/B, 128 batches per DMA). Partition p's row index
    o * M + w[b] (o its first prefix) is computed on device; its other prefixes sit M rows apart,
    a static step of the pattern."""
    O, M, I = cache.shape
    rows_view = cache.reshape((O * M, I))
    upd_rows = update.reshape((O, I))
    k = _prefixes_per_partition(per_batch, O)
    parts = per_batch // k                      # partitions per batch
    per_tile = P_MAX // parts                   # batches per DMA
    tiles = []
    for b0 in range(0, batch, per_tile):
        tiles.append((b0, min(per_tile, batch - b0)))
    # every tile's row indices before the first scatter, so no index load queues behind a
    # scatter's data and the scatters' descriptor generation runs back to back
    idx = []
    for b0_nb in tiles:
        b0, nb = b0_nb
        t = nl.ndarray((nb * parts, 1), nl.int32, buffer=nl.sbuf, name="row_idx")
        nisa.dma_copy(dst=t, src=w.ap([[1, nb], [0, parts], [1, 1]], offset=b0))   # w[b] per p
        idx.append(t)
    for j in range(len(tiles)):
        b0, nb = tiles[j]
        t = idx[j]
        base = nl.ndarray((nb * parts, 1), nl.int32, buffer=nl.sbuf, name="prefix_base")
        nisa.iota(dst=base, pattern=[[1, 1]], offset=b0 * per_batch * M, channel_multiplier=k * M)
        nisa.tensor_tensor(dst=t, data1=t, data2=base, op=nl.add)           # o * M + w[b]
    for j in range(len(tiles)):
        b0, nb = tiles[j]
        t = idx[j]
        n = nb * parts
        nisa.dma_copy(dst=rows_view.ap([[I, n], [M * I, k], [1, I]], offset=0, vector_offset=t,
                                       indirect_dim=0),
                      src=upd_rows.ap([[k * I, n], [I, k], [1, I]], offset=b0 * per_batch * I))


def _wrapped_rows(idx, w, b, s0, M, rows):
    """idx[p, 0] = (w[b] + s0 + p) mod M for p < rows, on device (w[b] + s < 2M)."""
    w_b = nl.ndarray((rows, 1), nl.int32, buffer=nl.sbuf, name="w_b")
    nisa.dma_copy(dst=w_b, src=w.ap([[0, rows], [1, 1]], offset=b))      # broadcast w[b]
    nisa.iota(dst=idx, pattern=[[1, 1]], offset=s0, channel_multiplier=1)
    nisa.tensor_tensor(dst=idx, data1=idx, data2=w_b, op=nl.add)
    wrap = nl.ndarray((rows, 1), nl.int32, buffer=nl.sbuf, name="wrap")
    nisa.tensor_scalar(dst=wrap, data=idx, op0=nl.greater_equal, operand0=M,
                       op1=nl.multiply, operand1=M)
    nisa.tensor_tensor(dst=idx, data1=idx, data2=wrap, op=nl.subtract)


def _circular_indirect(cache, update, w, batch, per_batch):
    O, M, I = cache.shape
    S = update.shape[1]
    rows_view = cache.reshape((O * M, I))
    word = dtype_bytes(cache.dtype)
    cols = min(I, SBUF_TILE_BYTES // word)           # a row wider than the budget goes in pieces
    chunk = max(1, min(per_batch, SBUF_TILE_BYTES // (cols * word)))
    for b in range(batch):
        for s0 in range(0, S, P_MAX):
            rows = min(P_MAX, S - s0)
            idx = nl.ndarray((rows, 1), nl.int32, buffer=nl.sbuf, name="row_idx")
            _wrapped_rows(idx, w, b, s0, M, rows)
            for o0 in range(0, per_batch, chunk):
                n = min(chunk, per_batch - o0)
                o = b * per_batch + o0
                src_pieces = _column_pieces(n, S, rows, I, cols)
                dst_pieces = _column_pieces(n, M, rows, I, cols)
                for j in range(len(src_pieces)):
                    src_pattern, c0 = src_pieces[j]
                    dst_pattern = dst_pieces[j][0]
                    shape = (rows, n, src_pattern[2][1])
                    upd_sb = nl.ndarray(shape, cache.dtype, buffer=nl.sbuf, name="upd_sb")
                    nisa.dma_copy(dst=upd_sb, src=update.ap(src_pattern,
                                                            offset=(o * S + s0) * I + c0))
                    dst = rows_view.ap(dst_pattern, offset=o * M * I + c0,
                                       vector_offset=idx, indirect_dim=0)
                    nisa.dma_copy(dst=dst, src=upd_sb)


def _circular_rows(cache, update, w, batch, per_batch):
    O, M, I = cache.shape
    S = update.shape[1]
    for b in range(batch):
        for s0 in range(0, S, P_MAX):
            rows = min(P_MAX, S - s0)
            idx = nl.ndarray((rows, 1), nl.int32, buffer=nl.sbuf, name="row_idx")
            _wrapped_rows(idx, w, b, s0, M, rows)
            for s in range(s0, s0 + rows):
                dst = cache.ap(_rows(per_batch, M, 1, I), offset=b * per_batch * M * I,
                               scalar_offset=idx[s - s0:s - s0 + 1, 0:1], indirect_dim=1)
                src = update.ap(_rows(per_batch, S, 1, I), offset=(b * per_batch * S + s) * I)
                nisa.dma_copy(dst=dst, src=src)
