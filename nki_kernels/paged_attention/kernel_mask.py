"""Custom masks in the attention kernel: per (query row, key) bits read from the device, so one
compile serves every mask of a shape bucket (the host lays them out: ``custom_mask.mask_table``).

The mask table is uint8 [rows * C, TB] in HBM: row (r * C + c) holds padded query row r's bits
for the keys of chunk c (positions c*T .. c*T + T - 1), bit k of byte j for key 8*j + k (little
bit order, FlashInfer's); TB = ceil(T / 8) bytes. A work item's cursor carries ``mrow``, the
table row of its first query at the current chunk ((OUT * C + chunk) in a [1, 1] int32 tile,
advanced with the cursor), so a masked chunk's bits for a tile of score rows (kv head, query
token, g) are one DMA: the tile's query rows at stride C rows, repeated over heads and g.
"""

from __future__ import annotations

from nki_kernels.backend import nisa, nl

from .work import C0, OUT

class CustomMask(nl.NKIObject):
    """The launch's mask table ``bits`` [rows * chunks, TB] uint8 @ HBM, its ``chunks`` per
    query row (C), and ``shift`` [R, TB * 8] uint8: k in column 8*j + k (made once)."""


def custom_mask(mask_bits, rows, R):
    """The launch's ``CustomMask`` over q's ``rows`` padded query rows, or None without a mask."""
    if mask_bits is None:
        return None
    TB = mask_bits.shape[1]
    shift = nl.ndarray((R, TB * 8), nl.uint8, buffer=nl.sbuf, name="mask_shift")
    nisa.iota(dst=shift, pattern=[[0, TB], [1, 8]], offset=0, channel_multiplier=0)
    return CustomMask(bits=mask_bits, chunks=mask_bits.shape[0] // rows, shift=shift)


def mask_start(cols, mask):
    """[1, 1] int32: the mask-table row of the item's first query at its first chunk,
    OUT * C + C0 (``cols``: ``item_columns``)."""
    row = nl.ndarray((1, 1), nl.int32, buffer=nl.sbuf, name="mask_row")
    nisa.scalar_tensor_tensor(dst=row, data=cols[0:1, OUT:OUT + 1], op0=nl.multiply,
                              operand0=mask.chunks, op1=nl.add, operand1=cols[0:1, C0:C0 + 1])
    return row


def masked_keep(mask, mask_row, keep, q0, Qt, G, chunk=0):
    """``keep`` [R, T] uint8 (the row's key range, ``mask_keep``) and-ed in place with the custom
    mask bits of the chunk at ``mask_row`` (``chunk`` chunks further: a tail's slots) for a tile
    of score rows (kv head, query token q0 + i of the item, g): one DMA of the rows' packed
    bytes, one shift, one and."""
    R, T = keep.shape
    C, TB = mask.chunks, mask.bits.shape[1]
    heads = R // (Qt * G)
    packed = nl.ndarray((R, TB), nl.uint8, buffer=nl.sbuf, name="mask_bytes")
    nisa.dma_copy(dst=packed, src=mask.bits.ap([[0, heads], [C * TB, Qt], [0, G], [1, TB]],
                                               offset=(q0 * C + chunk) * TB,
                                               scalar_offset=mask_row, indirect_dim=0))
    bits = nl.ndarray((R, TB * 8), nl.uint8, buffer=nl.sbuf, name="mask_bits")
    nisa.tensor_tensor(dst=bits.ap([[TB * 8, R], [8, TB], [1, 8]]),
                       data1=packed.ap([[TB, R], [1, TB], [0, 8]]),
                       data2=mask.shift.ap([[TB * 8, R], [8, TB], [1, 8]]), op=nl.right_shift)
    nisa.tensor_tensor(dst=keep, data1=bits[:, 0:T], data2=keep, op=nl.bitwise_and)
    return keep
