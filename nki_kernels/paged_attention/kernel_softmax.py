"""Online-softmax pieces of the decode kernel: per (request, kv head) state [G rows] in SBUF fp32.

State: negm (minus the running max m; m starts at -3.4e38, finite so exp(m_old - m_new) never sees
inf - inf),
l (running sum of exp), acc [G, D] (running P @ V). Masked logits are replaced by -3.4e38 (selected,
never added: a NaN or inf score at a key a row does not see cannot reach it), so their exp is 0
once any real logit has been seen; a chunk seen before any real logit is wiped by the rescale
exp(m_old - m_new) = 0 when one arrives.
"""

from __future__ import annotations

from nki_kernels.backend import nisa, nl
from nki_kernels.kernel_dtypes import dtype_bytes

from .kernel_load import PSUM_BANK_BYTES, KTTile, PackedKT


def rows_at(t, pattern, offset, b):
    """``t``'s elements ``pattern`` from row ``b`` (of its first dimension) plus ``offset``: ``b``
    a device scalar (a dynamic DMA: descriptors made at run time), or an int when the row is
    known at compile time (a static pass's rows: a static DMA, no descriptor generation)."""
    if isinstance(b, int):
        row = 1
        for d in t.shape[1:]:
            row *= d
        return t.ap(pattern, offset=offset + b * row)
    return t.ap(pattern, offset=offset, scalar_offset=b, indirect_dim=0)


NEG_BIG = -3.4028235e38
LN_TO_LOG2 = 1.4426950408889634


def _f32(shape, name):
    return nl.ndarray(shape, nl.float32, buffer=nl.sbuf, name=name)


def state_tile(rows, D):
    """[rows, D + 2] fp32 SBUF tile of one softmax state, columns [negm, l, acc (D)], holding
    the identity: negm = -NEG_BIG (finite), l = 0, acc = 0. One tile, so a state moves to and
    from HBM (the chain of a unit's work items) and to the other core in one transfer."""
    st = _f32((rows, D + 2), "state")
    nisa.memset(dst=st[:, 1:D + 2], value=0.0, engine=nisa.engine.gpsimd)
    nisa.memset(dst=st[:, 0:1], value=-NEG_BIG, engine=nisa.engine.gpsimd)
    return st


def blank_state(rows, D):
    """An uninitialised [rows, D + 2] fp32 state tile for an item whose first softmax step
    initialises it (``softmax_begin(first=True)``), so it needs no identity memsets."""
    return _f32((rows, D + 2), "state")


def blank_bank(rows, D, tiles):
    """``blank_state`` of ``tiles`` states side by side: an uninitialised [rows, tiles * (D + 2)]
    bank and its views."""
    bank = _f32((rows, tiles * (D + 2)), "states")
    return bank, bank_views(bank, tiles)


def state_bank(rows, D, tiles):
    """[rows, tiles * (D + 2)] fp32 SBUF tile of ``tiles`` softmax states side by side, each
    holding the identity, and its per-tile ``state_tile``-shaped views: the one-element state
    columns of several tiles (negm, l at a stride of D + 2) then take one instruction
    (``group_stats``, ``group_sums``, ``finalize_bank``) instead of one per tile."""
    E = D + 2
    bank = _f32((rows, tiles * E), "states")
    nisa.memset(dst=bank, value=0.0, engine=nisa.engine.gpsimd)
    nisa.memset(dst=bank[:, 0:tiles * E:E], value=-NEG_BIG, engine=nisa.engine.gpsimd)
    views = []
    for t in range(tiles):
        views.append(bank[:, t * E:(t + 1) * E])
    return bank, views


def bank_column(bank, D, column, t0, n):
    """[rows, n] view of ``column`` (0 negm, 1 l) of the bank's tiles t0..t0+n-1."""
    E = D + 2
    return bank[:, t0 * E + column:(t0 + n) * E:E]


def poison_state(st, poison):
    """Add ``poison`` [rows, 1] (0, or NaN for a query row that held a non-finite element: see
    ``kernel_queries``) to a state's l and acc, so the row's output and LSE end NaN whatever its
    scores (they were computed from the cleaned row)."""
    D = st.shape[1] - 2
    nisa.tensor_scalar(dst=st[:, 1:D + 2], data=st[:, 1:D + 2], op0=nl.add, operand0=poison)


# A real score's exponent argument stays far below this fraction of NEG_BIG: a row whose
# running max is still at or past it saw only masked keys (``forget_unseen``).
UNSEEN_FRACTION = 0.5


def forget_unseen(state, exp_scale):
    """Zero l and acc of the rows that saw no unmasked key (a custom mask can hide every key of
    a row, ``kernel_mask``): their running max is still near the masked score's (-NEG_BIG * exp_scale, or the
    identity's), so ``finalize`` gives them output 0 and LSE -inf (FlashInfer's fully masked
    row); rows with a real key keep theirs."""
    negm, l, acc = state
    R = negm.shape[0]
    seen = nl.ndarray((R, 1), nl.float32, buffer=nl.sbuf, name="seen")
    nisa.tensor_scalar(dst=seen, data=negm, op0=nl.less,
                       operand0=-NEG_BIG * UNSEEN_FRACTION * min(1.0, exp_scale))
    nisa.tensor_scalar(dst=l, data=l, op0=nl.multiply, operand0=seen)
    nisa.tensor_scalar(dst=acc, data=acc, op0=nl.multiply, operand0=seen)


def state_views(st):
    """[negm, l, acc] views of a ``state_tile``."""
    return [st[:, 0:1], st[:, 1:2], st[:, 2:st.shape[1]]]


def _slot_rows(scratch, slot, t, R, rows):
    """Rows of tile t's state in scratch slot ``slot`` (a device scalar, or an int: a static
    DMA, ``rows_at``): scratch is [slots, tiles * R, D + 2] fp32 in HBM."""
    E = scratch.shape[2]
    return rows_at(scratch, [[E, rows], [1, E]], t * R * E, slot)


def load_state(scratch, slot, t, R, rows):
    """A new [rows, D + 2] state tile holding tile t's state kept in scratch slot ``slot`` (a
    null item's slot is past the scratch: skipped, work.NullItems)."""
    st = _f32((rows, scratch.shape[2]), "kept_state")
    nisa.dma_copy(dst=st, src=_slot_rows(scratch, slot, t, R, rows), oob_mode=nisa.oob_mode.skip)
    return st


def store_state(scratch, slot, t, R, st):
    nisa.dma_copy(dst=_slot_rows(scratch, slot, t, R, st.shape[0]), src=st,
                  oob_mode=nisa.oob_mode.skip)


def _bank_rows(scratch, slot, R, tiles):
    """Every tile's state in scratch slot ``slot`` as a [R, tiles, D + 2] pattern (tiles of R
    rows each)."""
    E = scratch.shape[2]
    return scratch.ap([[E, R], [R * E, tiles], [1, E]], offset=0, scalar_offset=slot,
                      indirect_dim=0)


def bank_views(bank, tiles):
    """The per-tile ``state_tile``-shaped views of a [R, tiles * (D + 2)] bank."""
    E = bank.shape[1] // tiles
    views = []
    for t in range(tiles):
        views.append(bank[:, t * E:(t + 1) * E])
    return views


def load_bank(scratch, slot, R, tiles):
    """A new [R, tiles * (D + 2)] bank holding every tile's state kept in scratch slot ``slot``,
    in one DMA (a null item's slot is past the scratch: skipped), and its views."""
    bank = _f32((R, tiles * scratch.shape[2]), "kept_states")
    nisa.dma_copy(dst=bank, src=_bank_rows(scratch, slot, R, tiles),
                  oob_mode=nisa.oob_mode.skip)
    return bank, bank_views(bank, tiles)


def store_bank(scratch, slot, bank, tiles):
    """``store_state`` of every tile of a bank in one DMA."""
    nisa.dma_copy(dst=_bank_rows(scratch, slot, bank.shape[0], tiles), src=bank,
                  oob_mode=nisa.oob_mode.skip)


def mask_keep(cursor, bounds, iota_rt):
    """[R, T] uint8: 1 where the chunk's token t is inside [W, L) of the row, else 0 (the
    predicate ``chunk_scores`` selects with). ``iota_rt`` holds t in column t; with s = the
    chunk's first position, t is inside when W - s <= t < L - s (t < L - s: no window)."""
    R = iota_rt.shape[0]
    hi = nl.ndarray((R, 1), nl.int32, buffer=nl.sbuf, name="lim_hi")
    nisa.tensor_tensor(dst=hi, data1=bounds.L_r, data2=cursor["start"], op=nl.subtract)
    lo = None
    if bounds.W_r is not None:
        lo = nl.ndarray((R, 1), nl.int32, buffer=nl.sbuf, name="lim_lo")
        nisa.tensor_tensor(dst=lo, data1=bounds.W_r, data2=cursor["start"], op=nl.subtract)
    return keys_between(iota_rt, hi, lo)


class KeyRange(nl.NKIObject):
    """Per score row r the key columns [lo_r, hi_r) a softmax step keeps, as bounds rather than
    a predicate tile: ``hi`` / ``lo`` [R, 1] fp32 offsets from the step's first column at
    ``start`` (``lo`` None: no lower bound). ``evict_scores`` selects with one ``range_select``
    (NeuronCore-v3+), so no [R, W*T] predicate is made on VectorE first."""

    def __init__(self, hi, lo, start=0):
        self.hi, self.lo, self.start = hi, lo, start

    def window(self, rows, start):
        """The range for the first ``rows`` rows of the step whose first column is ``start``."""
        return KeyRange(self.hi[0:rows, :], None if self.lo is None else self.lo[0:rows, :],
                        start)


def keys_between(t, hi, lo=None, name="ok_g"):
    """[R, n] uint8 predicate 1 where lo <= t < hi (``t``: key offsets, [R, n] int32; ``hi``,
    ``lo``: [R, 1] per-row limits; ``lo`` None: no lower limit, a launch without a window)."""
    keep = nl.ndarray(t.shape, nl.uint8, buffer=nl.sbuf, name=name)
    nisa.tensor_scalar(dst=keep, data=t, op0=nl.less, operand0=hi)
    if lo is not None:
        late = nl.ndarray(t.shape, nl.uint8, buffer=nl.sbuf, name="late_g")
        nisa.tensor_scalar(dst=late, data=t, op0=nl.greater_equal, operand0=lo)
        nisa.tensor_tensor(dst=keep, data1=keep, data2=late, op=nl.multiply)
    return keep


def transpose_dtype(dtype):
    """PSUM dtype of a TensorE transpose: the input's from NeuronCore-v3 (16-bit PE transpose
    mode); fp32 on NeuronCore-v2, where a transpose is an ordinary fp32-accumulating matmul."""
    return dtype if nisa.get_nc_version() >= nisa.nc_version.gen3 else nl.float32


def raw_scores(q_pads, kTs, T, mm_dtype, blocks=1):
    """PSUM [n*G, W*T] fp32 for W chunks of T keys side by side (W*T fp32 <= one 2 KiB bank):
    row block j = queries of head h0+j against K of head h0+j (zero-padded stationaries keep the
    heads apart). ``kTs``: per chunk, ``k_transposed`` of the tile's heads. ``blocks``: packed
    requests (``group_queries``): each request's heads accumulate into its own rows only."""
    Rb = q_pads[0][0].shape[1]                 # a request's rows (``blocks`` packed ones)
    Hb = len(q_pads) // blocks
    s_ps = nl.ndarray((Rb * blocks, len(kTs) * T), nl.float32, buffer=nl.psum, name="s_ps")
    for c in range(len(kTs)):
        kT = kTs[c]
        for j in range(len(q_pads)):
            parts = q_pads[j]
            r0 = j // Hb * Rb
            for k in range(len(parts)):
                nisa.nc_matmul(dst=s_ps[r0:r0 + Rb, c * T:(c + 1) * T], stationary=parts[k],
                               moving=kT[(j, k)], accumulate=(j % Hb, k) != (0, 0))
    return s_ps


def k_transposed(k_sb, h0, n, D, mm_dtype, vector_share):
    """{(j, k): K^T [dp, T] in SBUF} of heads h0..h0+n-1 and 128-row pieces k of the head dim, made on
    TensorE in <= 128-row pieces: the transposes of as many heads as fill one PSUM bank go side by
    side into one tile, evicted by two instructions (ScalarE and VectorE parts, ``vector_share`` of
    it on VectorE: 0 or 0.5) instead of one per head. Made once per chunk and kv heads, shared by
    every tile of query rows of those heads, and all of a step's before its first matmul, so
    TensorE transposes the next chunk while the last one's K^T is evicted."""
    if isinstance(k_sb, (KTTile, PackedKT)):       # transposed by its gather
        kT = {}
        for j in range(n):
            kT[(j, 0)] = k_sb.head(h0 + j)
        return kT
    T = k_sb.tile.shape[0]
    t_dtype = transpose_dtype(k_sb.tile.dtype)
    per = max(1, min(n, PSUM_BANK_BYTES // (T * dtype_bytes(t_dtype))))
    kT = {}
    for k in range((D + 127) // 128):
        d0 = 128 * k
        dp = min(128, D - d0)
        for j0 in range(0, n, per):
            m = min(per, n - j0)
            kT_ps = nl.ndarray((dp, m * T), t_dtype, buffer=nl.psum, name="kT_ps")
            for i in range(m):
                nisa.nc_transpose(dst=kT_ps[:, i * T:(i + 1) * T],
                                  data=k_sb.head(h0 + j0 + i, d0, dp))
            kT_sb = nl.ndarray((dp, m * T), mm_dtype, buffer=nl.sbuf, name="kT")
            half = int(m * (1 - vector_share)) * T
            if half and half < m * T:
                nisa.tensor_copy(dst=kT_sb[:, half:], src=kT_ps[:, half:])
            nisa.activation(dst=kT_sb[:, 0:half or m * T], op=nl.copy,
                            data=kT_ps[:, 0:half or m * T])
            for i in range(m):
                kT[(j0 + i, k)] = kT_sb[:, i * T:(i + 1) * T]
    return kT


def chunk_scores(q_pads, kTs, T, keep, scale, soft_cap, mm_dtype, keep_all=None, row_max=None,
                 plain_mask=False, blocks=1, columns=None):
    """The scores of W chunks (``kTs``: each chunk's ``k_transposed``) for a tile of query rows,
    as (SBUF [n*G, W*T] fp32, row max or None, exponent scale), issued ahead of the softmax
    (``softmax_begin``) so TensorE makes the next scores while VectorE and ScalarE work on
    these.

    Without a soft cap, one VectorE pass (``select_reduce``) evicts the raw PSUM scores, puts
    NEG_BIG where ``keep`` (``mask_keep``; ``keep_all``, a tile of ones, for a mask-free chunk)
    is 0 and takes each row's max; the scale joins the exponent. With a cap, ScalarE scales and
    caps (copy, tanh), VectorE multiplies back and selects the mask (with the row max).
    ``columns``: only the first ones are evicted (``kernel_items.diagonal_columns``)."""
    s_ps = raw_scores(q_pads, kTs, T, mm_dtype, blocks)
    if columns is not None and columns < s_ps.shape[1]:
        s_ps = s_ps[:, 0:columns]
    return evict_scores(s_ps, keep, scale, soft_cap, keep_all, row_max, plain_mask)


def evict_scores(s_ps, keep, scale, soft_cap, keep_all=None, row_max=None, plain_mask=False):
    """``chunk_scores``' second half: the PSUM scores ``s_ps`` (``raw_scores``) evicted, masked
    and their row max taken, as (SBUF scores, row max or None, exponent scale). ``plain_mask``:
    no custom mask (``forget_unseen`` assumes the scale of ``Step.exp_scale``), so a masked
    chunk's scores take the one VectorE pass too (decode: ScalarE's eviction copy saved)."""
    R, WT = s_ps.shape
    s = _f32((R, WT), "s")
    if isinstance(keep, KeyRange):             # (no soft cap nor custom mask: ranged_keys)
        if row_max is None:
            row_max = _f32((R, 1), "row_max")
        nisa.range_select(dst=s, on_true_tile=s_ps, comp_op0=nl.greater_equal,
                          bound0=-1.0 if keep.lo is None else keep.lo, comp_op1=nl.less,
                          bound1=keep.hi, range_start=keep.start, reduce_res=row_max,
                          reduce_cmd=nisa.reduce_cmd.reset_reduce, reduce_op=nl.maximum,
                          on_false_value=NEG_BIG)
        return s, row_max, float(scale)
    if soft_cap <= 0 and (keep_all is not None or (plain_mask and keep is not None)):
        if row_max is None:                    # else a column of its group's [R, K] tile
            row_max = _f32((R, 1), "row_max")
        # a masked score scales to NEG_BIG in the exponent (-inf when the scale is below 1): a
        # row with no key then has the identity's max, as with the scores scaled first
        masked = NEG_BIG
        if keep_all is None:
            masked = NEG_BIG / scale if scale >= 1.0 else float("-inf")
        nisa.select_reduce(dst=s, predicate=keep_all[0:R, 0:WT] if keep is None else keep,
                           on_true=s_ps, on_false=masked, reduce_res=row_max,
                           reduce_cmd=nisa.reduce_cmd.reset_reduce, reduce_op=nl.maximum)
        return s, row_max, float(scale)
    nisa.activation(dst=s, op=nl.copy, data=s_ps, scale=float(scale))
    if soft_cap > 0:
        nisa.activation(dst=s, op=nl.tanh, data=s, scale=1.0 / soft_cap)
        nisa.tensor_scalar(dst=s, data=s, op0=nl.multiply, operand0=float(soft_cap))
    if keep is not None:                       # the row max comes with the selection
        row_max = _f32((R, 1), "row_max")
        nisa.select_reduce(dst=s, predicate=keep, on_true=s, on_false=NEG_BIG, reduce_res=row_max,
                           reduce_cmd=nisa.reduce_cmd.reset_reduce, reduce_op=nl.maximum)
        return s, row_max, 1.0
    return s, None, 1.0


class SoftmaxHalf(nl.NKIObject):
    """What ``softmax_begin`` leaves for ``softmax_end``: the state, alpha, the row sums (None
    when grouped or first), P^T per chunk, the V tiles, the tile's kv heads and whether it is
    the state's first step."""


def group_stats(negm, row_max, scale, copy_engine=None, first=False):
    """The running-max step of a group of K tiles of one softmax step at once: ``negm`` the
    tiles' state column [R, K] (``bank_column``), ``row_max`` [R, K] their scores' row maxima.
    Returns ([R, K] new -max, [R, K] alpha = e^(m_old - m_new), [R, K] row sums to fill) for
    ``softmax_begin(group=...)`` column by column; the state's max is current on return.
    ``first``: the states' first step (a ``blank_bank``): the max is set, capped at the
    identity's as the running minimum with it would be, and alpha is None."""
    R, K = row_max.shape
    negm_new = _f32((R, K), "neg_m_g")
    if first:
        nisa.tensor_scalar(dst=negm_new, data=row_max, op0=nl.multiply, operand0=-scale,
                           op1=nl.minimum, operand1=-NEG_BIG)
        _copy_max(negm, negm_new, copy_engine)
        return negm_new, None, _f32((R, K), "row_sum_g")
    nisa.scalar_tensor_tensor(dst=negm_new, data=row_max, op0=nl.multiply, operand0=-scale,
                              op1=nl.minimum, operand1=negm)
    alpha = _f32((R, K), "alpha_g")
    nisa.tensor_tensor(dst=alpha, data1=negm_new, data2=negm, op=nl.subtract)
    nisa.activation(dst=alpha, op=nl.exp, data=alpha)
    _copy_max(negm, negm_new, copy_engine)
    return negm_new, alpha, _f32((R, K), "row_sum_g")


def _copy_max(negm, negm_new, copy_engine):
    """The new -max into the state (on ``copy_engine``, VectorE by default)."""
    if copy_engine is None:
        nisa.tensor_copy(dst=negm, src=negm_new)
    else:
        nisa.tensor_copy(dst=negm, src=negm_new, engine=copy_engine)


def group_sums(l, stats):
    """l = l alpha + row sum for the group's tiles at once (``l``: [R, K] ``bank_column``, after
    every tile's ``softmax_begin``); l = row sum on the states' first step (no alpha)."""
    _, alpha, row_sum = stats
    if alpha is None:
        nisa.tensor_copy(dst=l, src=row_sum)
        return
    nisa.tensor_tensor(dst=l, data1=l, data2=alpha, op=nl.multiply)
    nisa.tensor_tensor(dst=l, data1=l, data2=row_sum, op=nl.add)


def softmax_begin(state, scores, heads, v_tiles, h0, D, p_dtype, copy_engine=None, group=None,
                  dma_pT=False, first=False, acc_on_gpsimd=False):
    """Fold ``scores`` (``chunk_scores``: tile [R, W*T], row max or None, exponent scale) of W
    chunks with V tiles [T, H*D] into the state of a group of ``heads`` kv heads (rows R), in
    place (a device loop's body reuses its own buffers every iteration), P in ``p_dtype`` (the
    matmul dtype); the fixed cost of each instruction is paid once per W chunks. This first
    half of the step (``softmax_end`` the second): VectorE the running
    max, ScalarE exp of the scaled scores with the row sum and alpha = e^(m_old - m_new), the
    new max copied into the state, P^T on TensorE evicted by ScalarE. The state's max is
    current when it returns, so the next step of the same state may begin before this one's
    ``softmax_end``: issuing the next tile's begin first keeps VectorE from waiting on this
    tile's exp. ``copy_engine``: where the new max is copied (default VectorE). ``group``:
    this tile's columns (new -max, alpha, row sum) of its group's ``group_stats``, which did the
    running max; its l is then updated by ``group_sums``, not by ``softmax_end``. ``dma_pT``:
    P^T by a DMA transpose (2-byte P, NeuronCore-v3+) instead of TensorE and a ScalarE
    eviction: the DMA engines are the idlest when blocks of queries make many scores per key.
    ``first``: the state's first step (a ``blank_state``): its max, sum and acc are set, not
    rescaled (the max capped at the identity's, as the running minimum with it would).
    ``acc_on_gpsimd``: ``softmax_end`` rescales acc on GpSimd (``gpsimd_rescale``)."""
    s, row_max, scale = scores
    negm, l, acc = state
    T = v_tiles[0].tile.shape[0]
    R, WT = s.shape
    p = nl.ndarray((R, WT), p_dtype, buffer=nl.sbuf, name="p")
    if group is not None:                      # (alpha None on the first step)
        negm_new, alpha, row_sum = group
        nisa.activation(dst=p, op=nl.exp, data=s, bias=negm_new, scale=scale, reduce_op=nl.add,
                        reduce_res=row_sum, reduce_cmd=nisa.reduce_cmd.reset_reduce)
    elif first:
        if row_max is None:
            nisa.tensor_reduce(dst=negm, op=nl.maximum, data=s, axis=1, negate=True)
        else:
            nisa.tensor_scalar(dst=negm, data=row_max, op0=nl.multiply, operand0=-scale,
                               op1=nl.minimum, operand1=-NEG_BIG)
        nisa.activation(dst=p, op=nl.exp, data=s, bias=negm, scale=scale, reduce_op=nl.add,
                        reduce_res=l, reduce_cmd=nisa.reduce_cmd.reset_reduce)
        alpha, row_sum = None, None
    else:
        negm_new = _f32((R, 1), "neg_m")
        if row_max is None:
            nisa.tensor_reduce(dst=negm_new, op=nl.maximum, data=s, axis=1, negate=True)
            nisa.tensor_tensor(dst=negm_new, data1=negm_new, data2=negm, op=nl.minimum)
        else:                                  # -(scale * row max), then the running minimum
            nisa.scalar_tensor_tensor(dst=negm_new, data=row_max, op0=nl.multiply,
                                      operand0=-scale, op1=nl.minimum, operand1=negm)
        row_sum, alpha = _f32((R, 1), "row_sum"), _f32((R, 1), "alpha")
        nisa.activation(dst=p, op=nl.exp, data=s, bias=negm_new, scale=scale, reduce_op=nl.add,
                        reduce_res=row_sum, reduce_cmd=nisa.reduce_cmd.reset_reduce)
        nisa.activation(dst=alpha, op=nl.exp, data=negm, bias=negm_new, scale=-1.0)
        _copy_max(negm, negm_new, copy_engine)   # state lives in tiles made before the loop
    pTs = []
    for c in range(len(v_tiles)):
        w = min(T, WT - c * T)                 # (a narrowed step's last chunk: part of it)
        pT = nl.ndarray((w, R), p_dtype, buffer=nl.sbuf, name="pT")
        if dma_pT:
            nisa.dma_transpose(dst=pT, src=p[:, c * T:c * T + w])
        else:
            pT_ps = nl.ndarray((w, R), transpose_dtype(p_dtype), buffer=nl.psum, name="pT_ps")
            nisa.nc_transpose(dst=pT_ps, data=p[:, c * T:c * T + w])
            nisa.activation(dst=pT, op=nl.copy, data=pT_ps)
        pTs.append(pT)
    return SoftmaxHalf(state=state, alpha=alpha, row_sum=None if group is not None else row_sum,
                       pTs=pTs, v_tiles=v_tiles, heads=heads, h0=h0, D=D, first=first,
                       acc_on_gpsimd=acc_on_gpsimd)


def softmax_end(half):
    """The second half of a softmax step (``softmax_begin``'s result): P @ V on TensorE, and on
    VectorE l = l alpha + row sum (unless grouped or first) and acc = acc alpha + P @ V (= P @ V
    for the first step)."""
    negm, l, acc = half.state
    if half.row_sum is not None:               # else set by the first step's exp, or grouped
        nisa.scalar_tensor_tensor(dst=l, data=l, op0=nl.multiply, operand0=half.alpha,
                                  op1=nl.add, operand1=half.row_sum)
    R = half.pTs[0].shape[1]
    pv = (_pv_one_head if half.heads == 1 else _pv_heads)(half.pTs, half.v_tiles, half.h0,
                                                          half.D, R // half.heads)
    if half.first and half.acc_on_gpsimd:      # the state's first step: acc = P @ V
        nisa.activation(dst=acc, op=nl.copy, data=pv)    # (ScalarE evicts, as it would)
    elif half.first:
        nisa.tensor_copy(dst=acc, src=pv)
    elif half.acc_on_gpsimd:
        gpsimd_rescale(acc, half.alpha, pv)
    else:
        nisa.scalar_tensor_tensor(dst=acc, data=acc, op0=nl.multiply, operand0=half.alpha,
                                  op1=nl.add, operand1=pv)


def gpsimd_rescale(acc, alpha, pv):
    """acc = acc alpha + pv with VectorE left out: ScalarE evicts pv from PSUM (which GpSimd
    cannot read), GpSimd scales and adds. For the tiles of whole units where VectorE, which
    also makes every step's row max, is the busiest engine (``acc_on_gpsimd``); NeuronCore-v3+
    (on v2 VectorE and GpSimd cannot share SBUF at once)."""
    pv_sb = _f32(pv.shape, "pv_sb")
    nisa.activation(dst=pv_sb, op=nl.copy, data=pv)
    nisa.tensor_scalar(dst=acc, data=acc, op0=nl.multiply, operand0=alpha,
                       engine=nisa.engine.gpsimd)
    nisa.tensor_tensor(dst=acc, data1=acc, data2=pv_sb, op=nl.add, engine=nisa.engine.gpsimd)


def _pv_one_head(pTs, v_tiles, h0, D, rows):
    """PSUM [R, D] fp32 = P @ V of one kv head: P^T [T, R] stationary, V moving, per chunk."""
    R = pTs[0].shape[1]
    pv = nl.ndarray((R, D), nl.float32, buffer=nl.psum, name="pv_ps")
    for c, (pT, v_sb) in enumerate(zip(pTs, v_tiles)):
        nisa.nc_matmul(dst=pv, stationary=pT, moving=_key_rows(v_sb.head(h0, 0, D), pT),
                       accumulate=c != 0)
    return pv


def _key_rows(v, pT):
    """V rows [keys, D] of a chunk, the first ``pT``'s keys of them (a narrowed step's last
    chunk scores only part of its keys, ``kernel_items.diagonal_columns``)."""
    keys = pT.shape[0]
    return v if keys == v.shape[0] else v[0:keys, :]


def _pv_heads(pTs, v_tiles, h0, D, rows):
    """PSUM [R, D] fp32 = P @ V for a tile of several kv heads (``rows`` score rows each) without
    masking P per head: V of head j is the stationary and head j's columns of P^T [T, rows] the
    moving operand, so (P_j V_j)^T lands in head j's columns of a [D, R] PSUM tile (free-dim
    slices; partition slices of one head's rows would not start on a legal partition); one
    eviction and one fp32 transpose per 128 rows of D bring it back to [R, D]."""
    R = pTs[0].shape[1]
    pv = nl.ndarray((R, D), nl.float32, buffer=nl.psum, name="pv_ps")
    for d0 in range(0, D, 128):
        dp = min(128, D - d0)
        pvT_ps = nl.ndarray((dp, R), nl.float32, buffer=nl.psum, name="pvT_ps")
        for j in range(R // rows):
            cols = slice(j * rows, (j + 1) * rows)
            for c, (pT, v_sb) in enumerate(zip(pTs, v_tiles)):
                nisa.nc_matmul(dst=pvT_ps[:, cols], stationary=_key_rows(
                    v_sb.head(h0 + j, d0, dp), pT), moving=pT[:, cols], accumulate=c != 0)
        pvT = _f32((dp, R), "pvT")
        nisa.activation(dst=pvT, op=nl.copy, data=pvT_ps)
        nisa.nc_transpose(dst=pv[:, d0:d0 + dp], data=pvT)
    return pv


def finalize(state, out, lse, sinks, b, h0, G, Qb, v_scale, q0=0):
    """Query heads h0*G.. of the Qb query tokens at rows b + q0.. (b a device scalar) of out / lse:
    out = acc / l * v_scale; lse = (m + ln l) * log2(e). A sink logit joins as one more key
    without a value: the max becomes max(m, sink) and l gains exp(sink - max). A row with no keys
    has l = 0 and acc = 0: out is 0 (acc / max(l, 1); l >= 1 whenever a key was seen) and lse
    -inf (or the sink's log2 term). State rows: kv head j of the tile, then token, then G."""
    negm, l, acc = state
    R, D = acc.shape
    GQ = G * Qb
    if sinks is not None:
        sk = _f32((R, 1), "sink")
        if Qb == 1 and R > sinks.shape[0]:     # packed requests: each its query heads' sinks
            nisa.dma_copy(dst=sk, src=sinks.ap([[0, R // sinks.shape[0]], [1, sinks.shape[0]],
                                                [1, 1]], offset=0))
        elif Qb == 1:
            nisa.dma_copy(dst=sk, src=sinks[h0 * G:h0 * G + R, :])
        else:
            for j in range(R // GQ):        # kv head j's rows (token, g) take sink (h0 + j) * G + g
                nisa.dma_copy(dst=sk[j * GQ:(j + 1) * GQ, :],
                              src=sinks.ap([[0, Qb], [1, G], [1, 1]], offset=(h0 + j) * G))
        negm_new = _f32((R, 1), "neg_m")
        nisa.tensor_scalar(dst=negm_new, data=sk, op0=nl.multiply, operand0=-1.0)
        nisa.tensor_tensor(dst=negm_new, data1=negm_new, data2=negm, op=nl.minimum)
        alpha = _f32((R, 1), "alpha")
        nisa.activation(dst=alpha, op=nl.exp, data=negm, bias=negm_new, scale=-1.0)
        nisa.activation(dst=sk, op=nl.exp, data=sk, bias=negm_new)
        nisa.scalar_tensor_tensor(dst=l, data=l, op0=nl.multiply, operand0=alpha, op1=nl.add,
                                  operand1=sk)
        nisa.tensor_scalar(dst=acc, data=acc, op0=nl.multiply, operand0=alpha)
        negm = negm_new
    ln_l = _ln_sums(l)                 # ScalarE: l is final before acc (VectorE) is
    rl = _inverse_sums(l, v_scale)
    o = nl.ndarray((R, D), out.dtype, buffer=nl.sbuf, name="o")
    nisa.activation(dst=o, op=nl.copy, data=acc, scale=rl)
    _write_rows(out, o, b, h0, G, Qb, q0)
    _write_rows(lse, _log2_sums(ln_l, negm), b, h0, G, Qb, q0)


def _inverse_sums(l, v_scale=1.0):
    """[R, n] v_scale / max(l, 1) of n states' sums (a row that saw no key has l = 0: its output
    0): the scale ScalarE applies to the accumulators as it writes the outputs (VectorE carries
    the softmax)."""
    rl = _f32(l.shape, "inv_l")
    nisa.tensor_scalar(dst=rl, data=l, op0=nl.maximum, operand0=1.0, op1=nl.divide,
                       operand1=float(v_scale), reverse1=True)
    return rl


def _ln_sums(l):
    """[R, n] ln l of n states' sums (ScalarE), for ``_log2_sums``: issued before the
    outputs' scaling, so the LSE's write waits on no exponent after them."""
    ln_l = _f32(l.shape, "ln_l")
    nisa.activation(dst=ln_l, op=nl.log, data=l)
    return ln_l


def _log2_sums(ln_l, negm):
    """[R, n] LSE in base 2, (m + ln l) * log2(e), of n states (``negm`` = -m) from their
    ``_ln_sums``, in place."""
    if ln_l.shape[1] == 1:             # one state: -m is a per-partition operand
        nisa.tensor_scalar(dst=ln_l, data=ln_l, op0=nl.subtract, operand0=negm,
                           op1=nl.multiply, operand1=LN_TO_LOG2)
        return ln_l
    nisa.tensor_tensor(dst=ln_l, data1=ln_l, data2=negm, op=nl.subtract)
    nisa.tensor_scalar(dst=ln_l, data=ln_l, op0=nl.multiply, operand0=LN_TO_LOG2)
    return ln_l


def finalize_bank(bank, tiles, out, lse, b, G, Qb, v_scale):
    """``finalize`` of every tile of a ``state_bank`` (no sinks): 1 / max(l, 1) and the LSE of
    all tiles in one instruction each, then per tile its output rows and LSE written; with one
    kv head a tile, the heads' scaled copies take ScalarE, VectorE and GpSimd in turn (a loop
    iteration's end waits on them: a chunked-prefill launch of 3289 queries 2864 -> 2826 us
    with two engines; thirteen multi-unit launches 0.3% faster with the third).
    ``tiles``: (first kv head, kv heads, first query token) per tile, as ``Step.tiles``."""
    R = bank.shape[0]
    n = len(tiles)
    E = bank.shape[1] // n
    D = E - 2
    l, negm = bank_column(bank, D, 1, 0, n), bank_column(bank, D, 0, 0, n)
    ln_l = _ln_sums(l)
    rl = _inverse_sums(l, v_scale)
    ln_l = _log2_sums(ln_l, negm)
    heads = head_major(tiles)
    engines = 3 if nisa.get_nc_version() >= nisa.nc_version.gen3 else 2
    if side_by_side(tiles):     # tiles of n kv heads each, one block of queries: one DMA each
        o = nl.ndarray((R, n * D), out.dtype, buffer=nl.sbuf, name="o")
        for t in range(n):
            nisa.activation(dst=o[:, t * D:(t + 1) * D], op=nl.copy,
                            data=bank[:, t * E + 2:(t + 1) * E], scale=rl[:, t:t + 1])
        _write_tiles(out, o, b, tiles[0][1], G, Qb, n)
        _write_tiles(lse, ln_l, b, tiles[0][1], G, Qb, n)
        return
    if heads:                   # one kv head per tile: one DMA per query block for all heads
        HQ = out.shape[1]
        blocks = n // heads
        for j in range(blocks):
            q0 = tiles[j][2]
            o = nl.ndarray((R, heads * D), out.dtype, buffer=nl.sbuf, name="o")
            for h in range(heads):
                t = h * blocks + j
                _scaled_copy(o[:, h * D:(h + 1) * D], bank[:, t * E + 2:(t + 1) * E],
                             rl[:, t:t + 1], h % engines)
            # rows (token, g) of tile (h, j); free (h, d): out[b + q0 + token, h * G + g, d]
            nisa.dma_copy(dst=rows_at(out, [[HQ * D, Qb], [D, G], [G * D, heads], [1, D]],
                                      q0 * HQ * D, b), src=o)
            nisa.dma_copy(dst=rows_at(lse, [[HQ, Qb], [1, G], [G, heads]], q0 * HQ, b),
                          src=ln_l[:, j:n:blocks])
        return
    for t in range(n):
        h0, _, q0 = tiles[t]
        o = nl.ndarray((R, D), out.dtype, buffer=nl.sbuf, name="o")
        nisa.activation(dst=o, op=nl.copy, data=bank[:, t * E + 2:(t + 1) * E],
                        scale=rl[:, t:t + 1])
        _write_rows(out, o, b, h0, G, Qb, q0)
        _write_rows(lse, ln_l[:, t:t + 1], b, h0, G, Qb, q0)


def _scaled_copy(dst, src, scale, engine):
    """dst = src * scale ([R, 1] per row, ``src`` in SBUF): ``engine`` 0 ScalarE, 1 VectorE,
    2 GpSimd (NeuronCore-v3+: on v2 VectorE and GpSimd cannot share SBUF at once)."""
    if engine == 2:
        nisa.tensor_scalar(dst=dst, data=src, op0=nl.multiply, operand0=scale,
                           engine=nisa.engine.gpsimd)
    elif engine:
        nisa.tensor_scalar(dst=dst, data=src, op0=nl.multiply, operand0=scale)
    else:
        nisa.activation(dst=dst, op=nl.copy, data=src, scale=scale)


def side_by_side(tiles):
    """Whether ``tiles`` (``Step.tiles``) are two or more tiles of the same number of kv heads,
    one after another, over one block of queries: their states, queries and outputs then move
    in one DMA for all tiles (``load_bank``, ``query_tile_rows``, ``_write_tiles``)."""
    if len(tiles) < 2:
        return False
    n = tiles[0][1]
    for t in range(len(tiles)):
        if tiles[t][0] != t * n or tiles[t][1] != n or tiles[t][2] != 0:
            return False
    return True


def head_major(tiles):
    """The number of kv heads when ``tiles`` hold one kv head each, ordered kv head by kv head
    and within each by query block, every head with the same blocks (``Step.tiles`` of a block
    of queries with G x Qt = 128 rows); else 0."""
    heads = 0
    for tile in tiles:
        if tile[1] != 1:
            return 0
        heads = max(heads, tile[0] + 1)
    if heads == 0 or len(tiles) % heads:
        return 0
    blocks = len(tiles) // heads
    for t in range(len(tiles)):
        if tiles[t][0] != t // blocks or tiles[t][2] != tiles[t % blocks][2]:
            return 0
    return heads


def _write_rows(dst, rows, b, h0, G, Qb, q0):
    """Score rows (kv head j of the tile, token, g) -> dst[b + q0 + token, (h0 + j) * G + g, :] of a
    [rows, HQ, E] HBM tensor (b: a device scalar), one DMA per tile: its heads are adjacent in
    dst when Qb = 1, else a pattern over (kv head, token, g) (one DMA per kv head would order
    each write behind the one before: their bounding boxes interleave). A null item's row is past
    dst's (work.NullItems): the write is skipped."""
    R, E = rows.shape
    HQ = dst.shape[1]
    if Qb == 1:
        pattern = [[E, R], [1, E]]
    else:
        pattern = [[G * E, R // (G * Qb)], [HQ * E, Qb], [E, G], [1, E]]
    nisa.dma_copy(dst=rows_at(dst, pattern, (q0 * HQ + h0 * G) * E, b), src=rows,
                  oob_mode=nisa.oob_mode.skip)


def _write_tiles(dst, rows, b, n, G, Qb, tiles):
    """``_write_rows`` of ``side_by_side`` tiles at once: rows [R, tiles * E], tile t's columns
    holding its rows (kv head j of the tile, token, g) -> dst[b + token, (t * n + j) * G + g]."""
    R = rows.shape[0]
    E = rows.shape[1] // tiles
    HQ = dst.shape[1]
    if Qb == 1:
        pattern = [[E, R], [R * E, tiles], [1, E]]
    else:
        pattern = [[G * E, n], [HQ * E, Qb], [E, G], [n * G * E, tiles], [1, E]]
    nisa.dma_copy(dst=rows_at(dst, pattern, 0, b), src=rows, oob_mode=nisa.oob_mode.skip)


def merge_with_partner(st, p):
    """LNC=2: swap a ``state_tile`` with the other core (one ``nisa.sendrecv``, SBUF to SBUF) and
    merge the two in place (``merge_states``): both cores end with the same state."""
    peer = _f32(st.shape, "peer_state")
    nisa.sendrecv(src=st, dst=peer, send_to_rank=1 - p, recv_from_rank=1 - p, pipe_id=0)
    merge_states(st, peer)


def merge_bank_with_partner(bank, D, p):
    """LNC=2: ``merge_with_partner`` for a ``state_bank`` of side-by-side states at once: one
    ``nisa.sendrecv`` for the bank, the running maxima and both sides' weights of every tile in
    one instruction each, then each tile's sums rescaled (a whole unit's eight tiles: 64
    instructions became 22)."""
    E = D + 2
    R, W = bank.shape
    n = W // E
    peer = _f32((R, W), "peer_states")
    nisa.sendrecv(src=bank, dst=peer, send_to_rank=1 - p, recv_from_rank=1 - p, pipe_id=0)
    negm, peer_negm = bank[:, 0:W:E], peer[:, 0:W:E]
    negm_new, a_mine, a_peer = _f32((R, n), "neg_m"), _f32((R, n), "alpha"), _f32((R, n), "alpha")
    nisa.tensor_tensor(dst=negm_new, data1=negm, data2=peer_negm, op=nl.minimum)
    nisa.tensor_tensor(dst=a_mine, data1=negm_new, data2=negm, op=nl.subtract)
    nisa.activation(dst=a_mine, op=nl.exp, data=a_mine)
    nisa.tensor_tensor(dst=a_peer, data1=negm_new, data2=peer_negm, op=nl.subtract)
    nisa.activation(dst=a_peer, op=nl.exp, data=a_peer)
    for t in range(n):             # ScalarE scales this side's sums, VectorE adds the peer's
        sums = bank[:, t * E + 1:(t + 1) * E]
        nisa.activation(dst=sums, op=nl.copy, data=sums, scale=a_mine[:, t:t + 1])
        nisa.scalar_tensor_tensor(dst=sums, data=peer[:, t * E + 1:(t + 1) * E],
                                  op0=nl.multiply, operand0=a_peer[:, t:t + 1], op1=nl.add,
                                  operand1=sums)
    nisa.tensor_copy(dst=negm, src=negm_new)


def merge_states(st, other):
    """st <- the softmax state of both key sets: m = max(m0, m1), l = l0 a0 + l1 a1,
    acc = acc0 a0 + acc1 a1 with a_i = exp(m_i - m); an empty one (l = 0, the finite -NEG_BIG
    max) weighs 0. ``st``, ``other``: ``state_tile``-shaped tiles [rows, D + 2] (or views):
    l and acc are adjacent columns, rescaled and summed as one block."""
    negm, peer_negm = st[:, 0:1], other[:, 0:1]
    R = negm.shape[0]
    negm_new, a_mine, a_peer = _f32((R, 1), "neg_m"), _f32((R, 1), "alpha"), _f32((R, 1), "alpha")
    nisa.tensor_tensor(dst=negm_new, data1=negm, data2=peer_negm, op=nl.minimum)
    nisa.activation(dst=a_mine, op=nl.exp, data=negm, bias=negm_new, scale=-1.0)
    nisa.activation(dst=a_peer, op=nl.exp, data=peer_negm, bias=negm_new, scale=-1.0)
    sums = st[:, 1:st.shape[1]]
    nisa.tensor_scalar(dst=sums, data=sums, op0=nl.multiply, operand0=a_mine)
    nisa.scalar_tensor_tensor(dst=sums, data=other[:, 1:other.shape[1]], op0=nl.multiply,
                              operand0=a_peer, op1=nl.add, operand1=sums)
    nisa.tensor_copy(dst=negm, src=negm_new)
