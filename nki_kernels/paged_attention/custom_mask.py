"""Custom attention masks in FlashInfer's layout, and their device table.

FlashInfer's layout: request b's mask is a boolean [q_len_b, kv_len_b] matrix (True: the query
sees the key), flattened row-major, the requests concatenated (``custom_mask``, length
sum(q_len_b * kv_len_b)); or bit-packed per request with ``segment_packbits(..., bitorder=
"little")`` (``packed_custom_mask``, request b's bytes ceil(q_len_b * kv_len_b / 8) long, at
``mask_indptr[b]`` when given). A mask replaces ``causal``; ``window_left`` still applies.

On the device (``kernel_mask.py``) the bits are re-laid per padded query row and chunk of T
keys (``mask_table``), still one bit per score, so the table's shape is a bucket (rows and
chunks) and one compile serves every mask of it. Chunks whose bits are all ones for every query
of a work item stay mask-free (``with_mask_free_chunks``): a tree mask over a long prefix costs
what a causal one does.
"""

from __future__ import annotations

import numpy as np

from nki_kernels.buckets import bucket
from nki_kernels.paged_cache.checks import require_int32_vector

from .work import TAIL_CHUNKS, chunk_tokens

BITORDERS = ("big", "little")


def _bitorder(bitorder):
    if bitorder not in BITORDERS:
        raise ValueError(f"bitorder={bitorder!r} must be one of {BITORDERS}")
    return bitorder


def packbits(x, bitorder="big"):
    """x [n] (bool or 0/1) packed 8 per byte: uint8 [ceil(n / 8)], zero bits padding the last
    byte (NumPy's packbits; FlashInfer's default order is "big", its attention masks "little")."""
    x = np.asarray(x)
    if x.ndim != 1:
        raise ValueError(f"packbits takes a 1-D array, got shape {x.shape}")
    return np.packbits(x.astype(bool), bitorder=_bitorder(bitorder))


def segment_packbits(x, indptr, bitorder="big"):
    """Each segment x[indptr[i]:indptr[i + 1]] packed on its own (``packbits``): (packed uint8,
    new_indptr int32 [B+1]) with new_indptr[i + 1] - new_indptr[i] = ceil(segment length / 8)."""
    x = np.asarray(x)
    if x.ndim != 1:
        raise ValueError(f"segment_packbits takes a 1-D array, got shape {x.shape}")
    indptr = np.asarray(indptr)
    if indptr.ndim != 1 or indptr.size < 1 or not np.issubdtype(indptr.dtype, np.integer):
        raise ValueError(f"indptr must be a 1-D integer array of batch + 1 offsets, got "
                         f"{indptr.dtype} {indptr.shape}")
    if indptr[0] != 0 or (np.diff(indptr) < 0).any() or indptr[-1] != x.size:
        raise ValueError(f"indptr must start at 0, never decrease and end at len(x)={x.size}, "
                         f"got {indptr.tolist()[:8]}{'...' if indptr.size > 8 else ''}")
    order = _bitorder(bitorder)
    pieces = [np.packbits(x[a:b].astype(bool), bitorder=order)
              for a, b in zip(indptr[:-1], indptr[1:])]
    sizes = np.array([p.size for p in pieces], np.int64)
    new_indptr = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int32)
    packed = np.concatenate(pieces + [np.zeros(0, np.uint8)]).astype(np.uint8)
    return packed, new_indptr


def request_masks(custom_mask, packed_custom_mask, mask_indptr, q_lens, kv_lens):
    """The masks of a batch, a list of bool [q_len_b, kv_len_b] (None without a mask), from
    ``custom_mask`` or ``packed_custom_mask`` (which wins when both are given, as FlashInfer's
    plan); refuses a wrong dtype, length or ``mask_indptr`` by name."""
    q_lens, kv_lens = np.asarray(q_lens, np.int64), np.asarray(kv_lens, np.int64)
    sizes = q_lens * kv_lens
    if packed_custom_mask is not None:
        packed = packed_custom_mask
        if not isinstance(packed, np.ndarray) or packed.ndim != 1 or packed.dtype != np.uint8:
            raise TypeError(f"packed_custom_mask must be a 1-D uint8 array (segment_packbits "
                            f"with bitorder='little'), got {_describe(packed)}")
        nbytes = -(-sizes // 8)
        if mask_indptr is None:
            starts = np.concatenate([[0], np.cumsum(nbytes)])
            if packed.size != starts[-1]:
                raise ValueError(f"packed_custom_mask has {packed.size} bytes; the requests' "
                                 f"ceil(q_len * kv_len / 8) (qo_indptr, kv lengths) add up to "
                                 f"{starts[-1]}")
        else:
            starts = _mask_indptr(mask_indptr, nbytes, packed.size)
        return [np.unpackbits(packed[starts[b]:starts[b] + nbytes[b]], count=int(sizes[b]),
                              bitorder="little").astype(bool).reshape(q_lens[b], kv_lens[b])
                for b in range(q_lens.size)]
    if custom_mask is None:
        return None
    custom_mask = _bool_mask(custom_mask)
    starts = np.concatenate([[0], np.cumsum(sizes)])
    if custom_mask.size != starts[-1]:
        raise ValueError(f"custom_mask has {custom_mask.size} elements; the requests' q_len * "
                         f"kv_len (qo_indptr, kv lengths) add up to {starts[-1]}")
    return [custom_mask[starts[b]:starts[b + 1]].reshape(q_lens[b], kv_lens[b])
            for b in range(q_lens.size)]


def _bool_mask(mask):
    """``custom_mask`` as a 1-D bool array: bool, or integers that are all 0 or 1 (array-likes
    taken as NumPy would); anything else refused by name."""
    rule = ("custom_mask must be a 1-D bool array (each request's [q_len, kv_len] mask "
            "flattened row-major, concatenated; integer 0/1 also taken)")
    if not isinstance(mask, np.ndarray):
        try:
            mask = np.asarray(mask)
        except (TypeError, ValueError):
            raise TypeError(f"{rule}, got {type(mask).__name__}") from None
    if mask.ndim != 1:
        raise TypeError(f"{rule}, got {_describe(mask)}")
    if mask.dtype == np.bool_:
        return mask
    if np.issubdtype(mask.dtype, np.integer) and (mask.size == 0 or (
            (mask == 0) | (mask == 1)).all()):
        return mask.astype(bool)
    raise TypeError(f"{rule}, got {_describe(mask)}"
                    + (" holding values other than 0 and 1"
                       if np.issubdtype(mask.dtype, np.integer) else ""))


def _describe(a):
    return (f"{a.dtype} array of shape {a.shape}" if isinstance(a, np.ndarray)
            else type(a).__name__)


def _mask_indptr(mask_indptr, nbytes, total):
    """Byte offsets of the packed requests: int32 [B+1], from 0, each request's bytes exactly
    ceil(q_len * kv_len / 8), the last offset the packed length."""
    require_int32_vector("mask_indptr", mask_indptr, nbytes.size + 1, "batch + 1")
    ptr = mask_indptr.astype(np.int64)
    if ptr[0] != 0 or (np.diff(ptr) < 0).any():
        raise ValueError(f"mask_indptr must start at 0 and never decrease, got "
                         f"{ptr.tolist()[:8]}")
    bad = np.flatnonzero(np.diff(ptr) != nbytes)
    if bad.size:
        b = int(bad[0])
        raise ValueError(f"mask_indptr gives request {b} {int(ptr[b + 1] - ptr[b])} bytes; its "
                         f"q_len * kv_len bits take {int(nbytes[b])}")
    if ptr[-1] != total:
        raise ValueError(f"mask_indptr[-1]={int(ptr[-1])} must equal packed_custom_mask's "
                         f"{total} bytes")
    return ptr


def mask_chunks(kv_lens, page_size) -> int:
    """C: chunks per query row of the mask table, a bucket of the longest request's chunks,
    and TAIL_CHUNKS - 1 more (zero bits): a tail item (``work.TAIL``) reads the bits of all its
    chunk slots, those past its unit's keys included."""
    T = chunk_tokens(page_size)
    longest = int(np.max(np.asarray(kv_lens, np.int64), initial=0))
    return bucket(max(1, -(-longest // T))) + TAIL_CHUNKS - 1


def mask_table(masks, items, q_block, rows, page_size, item_rows=None):
    """uint8 [rows * C, ceil(T / 8)]: padded query row r's bits for chunk c at row r * C + c
    (bit k of byte j: key c*T + 8j + k, little order); zero bits for padding rows and keys past
    a request's end. ``items``: the launch's work items (``work.query_blocks``), q_block queries
    each at padded rows k * q_block.. (``item_rows[k]`` * q_block.. when given: a static pass's
    rows, ``work.static_rows_of``)."""
    T = chunk_tokens(page_size)
    TB = -(-T // 8)
    C = mask_chunks([m.shape[1] for m in masks], page_size)
    table = np.zeros((rows, C, TB), np.uint8)
    for k in range(items.request.size):
        m = masks[int(items.request[k])]
        q0 = int(items.q0[k])
        n, kv = max(0, min(q_block, m.shape[0] - q0)), m.shape[1]
        if n == 0:
            continue
        bits = np.zeros((n, C, TB * 8), bool)
        padded = np.zeros((n, C * T), bool)
        padded[:, :kv] = m[q0:q0 + n]
        bits[:, :, :T] = padded.reshape(n, C, T)
        r = k if item_rows is None else int(item_rows[k])
        table[r * q_block:r * q_block + n] = np.packbits(bits, axis=-1, bitorder="little")
    return table.reshape(rows * C, TB)


def with_mask_free_chunks(items, masks, q_block, page_size):
    """``items`` (``work.query_blocks``) with each item's mask-free chunks limited to those its
    mask keeps whole: full_hi moves down to the first chunk from full_lo on where a query of
    the item loses a key; the chunks after it are masked ones."""
    T = chunk_tokens(page_size)
    full_hi = items.full_hi.copy()
    for k in range(items.request.size):
        m = masks[int(items.request[k])]
        q0 = int(items.q0[k])
        rows = m[q0:q0 + q_block]
        lo, hi = int(items.full_lo[k]), int(items.full_hi[k])
        if rows.size == 0 or hi <= lo:
            continue
        end = min(hi * T, m.shape[1])
        lost = np.flatnonzero(~rows[:, lo * T:end].all(axis=0))
        if lost.size:
            full_hi[k] = max(lo, lo + int(lost[0]) // T)
    return items._replace(full_hi=full_hi)


def tree_mask(parents, prefix_len: int) -> np.ndarray:
    """bool [n, prefix_len + n]: the mask of a draft tree of n tokens verified in one step
    (speculative decoding), ``parents[i]`` the draft token i descends from (-1: the prefix's
    last token; parents come before children). Token i sees the whole prefix, its ancestors and
    itself."""
    parents = np.asarray(parents, np.int64)
    n = parents.size
    if parents.ndim != 1 or ((parents < -1) | (parents >= np.arange(n))).any():
        raise ValueError("parents must be a 1-D array with -1 <= parents[i] < i")
    if int(prefix_len) < 0:
        raise ValueError(f"prefix_len={prefix_len} must be >= 0")
    mask = np.zeros((n, int(prefix_len) + n), bool)
    mask[:, :prefix_len] = True
    seen = np.eye(n, dtype=bool)
    for i in range(n):
        if parents[i] >= 0:
            seen[i] |= seen[parents[i]]
    mask[:, prefix_len:] = seen
    return mask
