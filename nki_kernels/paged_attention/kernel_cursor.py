"""Where the current chunk is, kept in SBUF across the device loops of one request.

A compiled loop body cannot take Python values from the loop index, so the chunk's position
travels as small int32 tiles that each iteration advances by one chunk (T tokens):

    pos   [T, 1]  sequence position of chunk token t
    slot  [T, 1]  index into kv_indices of the page holding token t
    entry [T, 1]  entry of token t inside that page
    start [R, 1]  position of the chunk's first token, on the R score rows
    mrow  [1, 1]  custom-mask table row of the item's first query at this chunk (or None)

All values stay far below 2**24, so the fp32 ALU of VectorE computes them exactly.
"""

from __future__ import annotations

from typing import NamedTuple

from nki_kernels.backend import nisa, nl

from .kernel_mask import mask_start
from .work import ENTRY0, HI_BASE, LEN, META_COLS, POS0, Q_BASE, SLOT0, W_SPAN, WIN


class Geometry(NamedTuple):
    T: int                  # chunk tokens
    page_size: int
    rows_per_page: int
    entry_stride: int
    D: int
    H: int
    token_pattern: tuple    # one token's heads from its first element: ((step, num), ...)
    kt_dma: bool = False    # K gathered transposed ([D, heads, T]: kernel_load.KTTile)


def item_columns(meta, i, parts, count=1, tile=False, pack=1):
    """[parts, META_COLS] int32 per item: the table rows of work items i..i+count-1 in every
    partition (i: a device scalar), one DMA for all (the rows are consecutive): an item's
    scalars, bounds and cursor are all read from its row. ``tile``: also return the one
    [parts, count * META_COLS] tile they are views of (first). ``pack`` > 1: a static pass's
    packed items (``kernel.packed_requests``), each ``pack`` consecutive table rows from row i,
    request r's row on partitions r * parts / pack.. (its score rows)."""
    t = nl.ndarray((parts, count * META_COLS), nl.int32, buffer=nl.sbuf, name="item")
    if pack > 1:
        src = meta.ap([[META_COLS, pack], [0, parts // pack], [pack * META_COLS, count],
                       [1, META_COLS]], offset=i * META_COLS)
    elif isinstance(i, int):           # a static pass: rows known at compile time
        src = meta.ap([[0, parts], [1, count * META_COLS]], offset=i * META_COLS)
    else:
        src = meta.ap([[0, parts], [1, count * META_COLS]], scalar_offset=i, indirect_dim=0)
    nisa.dma_copy(dst=t, src=src)
    rows = []
    for k in range(count):
        rows.append(t[:, k * META_COLS:(k + 1) * META_COLS])
    if tile:
        return t, rows
    return rows if count > 1 else rows[0]


class Bounds(NamedTuple):
    """Request b's length and window start on the T token rows and the R score rows (the
    window starts None when the launch has no sliding window: every one is 0)."""

    L_t: object
    W_t: object
    L_r: object
    W_r: object


def request_bounds(cols, T, R, windowed=True):
    """The item's [WIN, LEN) on T token rows and R score rows (``cols``: ``item_columns``;
    ``windowed`` False: no window starts, see ``Bounds``)."""
    if not windowed:
        return Bounds(cols[0:T, LEN:LEN + 1], None, cols[0:R, LEN:LEN + 1], None)
    return Bounds(cols[0:T, LEN:LEN + 1], cols[0:T, WIN:WIN + 1], cols[0:R, LEN:LEN + 1],
                  cols[0:R, WIN:WIN + 1])


def query_of_row(row_tab, R, GQ, first=0):
    """[R, 1] int32: the query token (within its block) of score row r of a tile holding rows
    first..first+GQ of each kv head, from the host table row_tab [G*Qb, 1] of one kv head's rows
    (entry r: token r // G), repeated for each of the R // GQ heads of the tile."""
    t = nl.ndarray((R, 1), nl.int32, buffer=nl.sbuf, name="row_q")
    nisa.dma_copy(dst=t, src=row_tab.ap([[0, R // GQ], [1, GQ], [1, 1]], offset=first))
    return t


def block_bounds(cols, T, row_qs, windowed=True):
    """Bounds of a block of query tokens, a list of Bounds per tile of query tokens (``row_qs``:
    their row_q tiles, in order; NKI dicts take string keys only, so these are lists): the
    item's [WIN, LEN) on the T token rows (what it gathers; common to the tiles), and on each
    score row r of a tile (query qi = row_q[r]) its own keys
    [max(0, Q_BASE + qi - W_SPAN), min(HI_BASE + qi, LEN)) (causal mask and window per query).
    ``cols``: the item's ``item_columns``; ``windowed`` False: no window starts (``Bounds``)."""
    R = row_qs[0].shape[0]
    tok, rows = cols[0:T, :], cols[0:R, :]
    bounds = []

    def row_col(c):
        return rows[:, c:c + 1]
    for row_q in row_qs:
        L_r, W_r = query_row_keys(row_col, row_q, windowed)
        bounds.append(Bounds(tok[:, LEN:LEN + 1], tok[:, WIN:WIN + 1] if windowed else None,
                             L_r, W_r))
    return bounds


def query_row_keys(col, row_q, windowed=True):
    """Each score row's keys [W_r, L_r) of a block of query tokens (query qi = row_q[r], [R, 1]):
    L_r = min(HI_BASE + qi, LEN), W_r = max(0, Q_BASE + qi - W_SPAN) (work.py; causal mask and
    window per query), [R, n] int32 for ``col(c)``: column c of n items' table rows, [R, n].
    W_r is None when not ``windowed``."""
    shape = col(LEN).shape

    def add_q(dst, c):
        # one item: a tile add (GpSimd may take it; NeuronCore-v2's VectorE is the busier
        # engine: verify 16 x 4 x 1k on trn1 806 us with tensor_scalar here, 659 without);
        # several items' columns: qi broadcast along them
        if shape[1] == 1:
            _add_tiles(dst, col(c), row_q)
        else:
            nisa.tensor_scalar(dst=dst, data=col(c), op0=nl.add, operand0=row_q)
    L_r = nl.ndarray(shape, nl.int32, buffer=nl.sbuf, name="len_r")
    add_q(L_r, HI_BASE)
    nisa.tensor_tensor(dst=L_r, data1=L_r, data2=col(LEN), op=nl.minimum)
    if not windowed:
        return L_r, None
    W_r = nl.ndarray(shape, nl.int32, buffer=nl.sbuf, name="win_r")
    add_q(W_r, Q_BASE)
    nisa.tensor_tensor(dst=W_r, data1=W_r, data2=col(W_SPAN), op=nl.subtract)
    nisa.tensor_scalar(dst=W_r, data=W_r, op0=nl.maximum, operand0=0)
    return L_r, W_r


def _add_tiles(dst, a, b):
    nisa.tensor_tensor(dst=dst, data1=a, data2=b, op=nl.add)


def partition_iota(T):
    """[T, 1] int32 holding t on partition t."""
    iota_t = nl.ndarray((T, 1), nl.int32, buffer=nl.sbuf, name="iota_t")
    nisa.iota(dst=iota_t, pattern=[[1, 1]], offset=0, channel_multiplier=1)
    return iota_t


def start_cursor(cols, tok_sb, R, mask, iota_t):
    """The cursor at the item's first chunk: pos = POS0 + t, slot = SLOT0 + slot(t),
    entry = ENTRY0 + entry(t), start = POS0 (``cols``: ``item_columns``; tok_sb: the [T, 2]
    chunk-local token table), in tiles of its own (the loop advances them); with a custom mask
    (``kernel_mask.CustomMask``, or None) also mrow, its table row (``kernel_mask.mask_start``).
    ``iota_t``: [T, 1] int32 holding t (``partition_iota``, made once a launch)."""
    T = tok_sb.shape[0]
    cursor = {}
    for field in (("pos", POS0, iota_t), ("slot", SLOT0, tok_sb[:, 0:1]),
                  ("entry", ENTRY0, tok_sb[:, 1:2])):
        key, col, add = field
        cursor[key] = nl.ndarray((T, 1), nl.int32, buffer=nl.sbuf, name=key)
        _add_tiles(cursor[key], cols[0:T, col:col + 1], add)
    cursor["start"] = nl.ndarray((R, 1), nl.int32, buffer=nl.sbuf, name="start")
    nisa.tensor_copy(dst=cursor["start"], src=cols[0:R, POS0:POS0 + 1])
    cursor["mrow"] = None if mask is None else mask_start(cols, mask)
    return cursor


def advance(cursor, page_size, chunks=1):
    """Move the cursor ``chunks`` chunks on: T tokens each = T // P whole pages (P <= 128), or
    (one chunk only) 128 entries of one page, wrapping to the next slot at the page end (P a
    multiple of 128)."""
    T = cursor["pos"].shape[0]
    for key in ("pos", "start"):
        nisa.tensor_scalar(dst=cursor[key], data=cursor[key], op0=nl.add, operand0=T * chunks)
    if cursor["mrow"] is not None:
        nisa.tensor_scalar(dst=cursor["mrow"], data=cursor["mrow"], op0=nl.add, operand0=chunks)
    if page_size <= 128:
        nisa.tensor_scalar(dst=cursor["slot"], data=cursor["slot"], op0=nl.add,
                           operand0=T // page_size * chunks)
        return
    assert chunks == 1, "chunks inside a page advance one at a time"
    entry, slot = cursor["entry"], cursor["slot"]
    wrap = nl.ndarray((T, 1), nl.int32, buffer=nl.sbuf, name="wrap")
    nisa.tensor_scalar(dst=entry, data=entry, op0=nl.add, operand0=T)
    nisa.tensor_scalar(dst=wrap, data=entry, op0=nl.greater_equal, operand0=page_size)
    _add_tiles(slot, slot, wrap)
    nisa.tensor_scalar(dst=wrap, data=wrap, op0=nl.multiply, operand0=page_size)
    nisa.tensor_tensor(dst=entry, data1=entry, data2=wrap, op=nl.subtract)


def token_validity(cursor, bounds):
    """[T, 1] int32: 1 where the chunk's token t is inside [W, L) (below L: no window)."""
    T = cursor["pos"].shape[0]
    ok = nl.ndarray((T, 1), nl.int32, buffer=nl.sbuf, name="tok_ok")
    nisa.tensor_tensor(dst=ok, data1=cursor["pos"], data2=bounds.L_t, op=nl.less)
    if bounds.W_t is None:
        return ok
    late = nl.ndarray((T, 1), nl.int32, buffer=nl.sbuf, name="tok_late")
    nisa.tensor_tensor(dst=late, data1=cursor["pos"], data2=bounds.W_t, op=nl.greater_equal)
    nisa.tensor_tensor(dst=ok, data1=ok, data2=late, op=nl.multiply)
    return ok


DROPPED = -(2 ** 24)     # an index every access skips: below zero even after any source offset


def drop_invalid(dst, values, valid):
    """dst = values where valid (0/1) else DROPPED, as values*valid + (valid - 1)*2**24: each
    term and the sum are exact in fp32 for indices below 2**24."""
    off = nl.ndarray(valid.shape, nl.int32, buffer=nl.sbuf, name="dropped")
    nisa.tensor_scalar(dst=off, data=valid, op0=nl.subtract, operand0=1, op1=nl.multiply,
                       operand1=-DROPPED)
    nisa.tensor_tensor(dst=dst, data1=values, data2=valid, op=nl.multiply)
    nisa.tensor_tensor(dst=dst, data1=dst, data2=off, op=nl.add)
