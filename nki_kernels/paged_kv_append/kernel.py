"""The device half of the paged KV append: scatter token rows into cache rows.

Dimensions:  T tokens (a bucket: rows past the real count are padding), R cache rows, H kv heads,
    D head_dim, P page_size, n = min(128, T) tokens per tile (T is a multiple of n)
Args:
    k_rows: [R, row_elems] @ HBM, the K cache (or the whole fused cache) as rows, written in place
    v_rows: [R, row_elems] @ HBM, or None for a fused cache (V = k_rows + v_offset elements)
    key, value: [T, H, D] @ HBM, same dtype as the cache
    slots: [T, 1] int32 @ HBM, first cache row of each token (see layout.py); skipped and padded
        tokens hold SKIP_SLOT (out of bounds, dropped by ``oob_mode.skip``) or a spare page's row
    counts: [1, 2] int32 @ HBM: real tokens, tiles of n holding them (runtime data)
    token_pattern: one token's K (or V) elements from its first, ``(step, num)`` pairs built by
        ``access_patterns.PagedKVLayout.token`` (NHD: one run of H*D; HND: H runs of D, P*D apart)
    parts: 0, or the packed write's head groups per token (``slots`` [2 * T * parts, 1]: each
        part's first row in rows of D, ``layout.CacheGeometry.packed_slots``)
    quant: None, or [2, H*D] float32 @ HBM: quantize on write (an fp8 cache, wider rows): element
        e of a token's K (row 0) / V (row 1) is multiplied by quant[., e] (the reciprocal of its
        head's scale), clamped to +-``limit`` (the cache dtype's largest finite value) and
        rounded to the cache dtype, through SBUF (VectorE) instead of HBM to HBM
Paths (units of work: 128-token tiles on trn2, tokens on trn1):
    NeuronCore-v3+ (trn2): per tile of n tokens, the slots are loaded to SBUF and K and V are
        copied HBM to HBM by one indirect DMA each (``vector_offset`` = the tile's slots on the
        destination); NHD moves one contiguous H*D run per token, HND H runs of D. A fused cache
        (on one core, not quantized) loads a tile's K and V into one SBUF tile and writes both
        by one indirect DMA (``_scatter_tile_pair``: the writes to one tensor serialize, so one
        write instead of two: a Llama-3-8B tile 6.8 -> 4.6 us). A fused
        cache's bucket of T <= 64 tokens (``parts`` > 0, host-chosen: ``packed_parts``) stages
        K and V in one SBUF tile and writes both by ONE indirect DMA over 2 * T * parts
        partitions (``_scatter_packed``; ``slots`` then holds its destinations).
    NeuronCore-v2 (trn1, no indirect DMA): per token, its slot is loaded and its K and V rows are
        copied HBM to HBM by two ``scalar_offset`` DMAs.
    Every iteration of a device loop costs a scheduling barrier (~9 us, nki-library's dynamic
    flash-attention notes; ``nki_kernels/profile``), far more than one unit's DMAs, so units are
    issued in blocks: a bucket of at most ``TILES_PER_ITERATION`` (v3+) or
    ``TOKENS_PER_ITERATION`` (v2) units is one static pass (no loop; padding units cost their DMA
    issue, their rows skipped), a larger one loops over blocks of that many units with the trip
    count from ``counts`` (the program does not grow with T; the padding past the last block
    holding real tokens costs nothing).
HBM traffic is the appended K/V bytes read plus written (and 4 bytes of slot per token; the
paired write reads each tile holding tokens whole, its padding rows too).
LNC=2 (``kernel[2]``, trn2): program 0 writes K and program 1 writes V, an exact half each; a
fused cache not quantized, whose blocks hold an even number of tiles (``TURN_TILES`` or more),
is shared by tiles in turns instead (program p the tiles p, p + 2, ...), each tile's K and V
paired in one write as on one core (the writes to one tensor serialize).
Returns the tensors written, ``k_rows`` or ``(k_rows, v_rows)``: outputs aliasing the inputs, so
torch-xla keeps a call whose only effect is the write (the simulator hands back the caller's own
arrays; ``nki_kernels.torch.device`` copies back only if a runtime returns other buffers).
"""

from __future__ import annotations

from nki_kernels.backend import nki, nisa, nl
from nki_kernels.launch_options import program_cores

from nki_kernels.paged_cache.layout import split_token_pattern

P_MAX = 128
# Tiles a block needs for LNC=2 to share a fused cache's tiles in turns (``scatter_rows``): each
# core's paired writes then serialize half as many DMAs as its K (or V) writes would (four tiles
# of 128 Llama-3-8B tokens: 12.8 -> 11.4 us); with two, one core's single paired write is no
# faster than two of K, and a partial last tile leaves the cores unequal
TURN_TILES = 4
SKIP_SLOT = 2 ** 31 - 1


@nki.jit
def paged_kv_scatter_kernel(k_rows, v_rows, key, value, slots, counts, token_pattern, v_offset,
                            quant=None, limit=0.0, parts=0):
    scatter_rows(k_rows, v_rows, key, value, slots, counts, token_pattern, v_offset, quant, limit,
                 parts)
    return k_rows if v_rows is None else (k_rows, v_rows)


def scatter_rows(k_rows, v_rows, key, value, slots, counts, token_pattern, v_offset, quant=None,
                 limit=0.0, parts=0):
    """The kernel's body (arguments as above), for kernels that append before they read."""
    T = key.shape[0]
    if parts:
        _scatter_packed(k_rows, key, value, slots, token_pattern, parts)
        return
    n = min(P_MAX, T)
    token_elems = key.shape[1] * key.shape[2]
    targets = ((key, k_rows, 0, 0), (value, k_rows if v_rows is None else v_rows,
                                     v_offset if v_rows is None else 0, 1))
    tiles = nisa.get_nc_version() >= 3
    # LNC=2: a fused cache (not quantized, in blocks of an even number of tiles, at least
    # TURN_TILES) shares its tiles between the cores in turns, each tile's K and V paired in
    # one write; otherwise core 0 writes K and core 1 writes V
    per = units_per_iteration(T // n, nisa.get_nc_version()) if tiles else 1
    turns = (program_cores() == 2 and tiles and v_rows is None and quant is None
             and per % 2 == 0 and per >= TURN_TILES)
    if program_cores() == 2 and not turns:
        targets = targets[nl.program_id(0):nl.program_id(0) + 1]
    # quantize on write: each target's reciprocal scales broadcast to its units' partitions;
    # v3+: tiles of n tokens (one slot per partition), v2: tokens (slots in one partition)
    staged = []
    for target in targets:
        src, rows, offset, which = target
        inv = None if quant is None else _broadcast(quant, which, n if tiles else 1)
        if tiles:
            src = src.reshape((T // n, n * token_elems))
        staged.append((src, rows, offset, inv))
    per_unit = n if tiles else 1

    def load_slots(first, per):
        return _load_slots(slots, first, per, per_unit)

    # a fused cache on one core, not quantized: a tile's K and V staged side by side in SBUF and
    # written by one DMA (the writes to one tensor run one after another)
    paired = tiles and v_rows is None and quant is None and len(staged) == 2
    real_tiles = None
    if paired:                  # tiles holding real tokens: a padding tile's loads skip
        count_sb = nl.ndarray((1, 2), nl.int32, buffer=nl.sbuf, name="tile_counts")
        nisa.dma_copy(dst=count_sb, src=counts)
        real_tiles = nisa.scalar_load(count_sb[0:1, 1:2])

    def unit(i, slot):
        if paired:
            _scatter_tile_pair(i, slot, staged, n, token_elems, token_pattern, v_offset,
                               real_tiles)
        elif tiles:
            _scatter_tile(i, slot, staged, n, token_elems, token_pattern, limit)
        else:
            _scatter_token(i, slot, staged, token_pattern, token_elems, limit)

    _in_blocks(T // n if tiles else T, counts, 1 if tiles else 0, load_slots, unit,
               2 if turns else 1, nl.program_id(0) if turns else 0)


def _broadcast(quant, which, n):
    """Row ``which`` of ``quant`` [2, E] on n partitions: an SBUF [n, E] float32 tile."""
    E = quant.shape[1]
    tile = nl.ndarray((n, E), nl.float32, buffer=nl.sbuf, name="inv_scale")
    nisa.dma_copy(dst=tile, src=quant.ap([[0, n], [1, E]], offset=which * E))
    return tile


def _quantized(src_ap, inv, rows_dtype, n, token_elems, limit):
    """n tokens' rows (``src_ap`` [n, E] in HBM) scaled by ``inv`` [n, E], clamped to +-limit
    and rounded to the cache dtype: an SBUF tile the write DMA reads."""
    raw = nl.ndarray((n, token_elems), src_ap.dtype, buffer=nl.sbuf, name="new_rows")
    nisa.dma_copy(dst=raw, src=src_ap)
    scaled = nl.ndarray((n, token_elems), nl.float32, buffer=nl.sbuf, name="scaled_rows")
    nisa.tensor_tensor(dst=scaled, data1=raw, data2=inv, op=nl.multiply)
    out = nl.ndarray((n, token_elems), rows_dtype, buffer=nl.sbuf, name="quantized_rows")
    nisa.tensor_scalar(dst=out, data=scaled, op0=nl.minimum, operand0=limit, op1=nl.maximum,
                       operand1=-limit)
    return out


# NeuronCore-v3+: units are tiles of up to 128 tokens; a bucket of up to 4096 tokens runs
# without a loop (benchmarks/loop_blocks.py, trn2, 3300 bf16 tokens of 8 kv heads x 128:
# split cache 141 us in blocks of 8, 95 in one; fused 163 / 117)
TILES_PER_ITERATION = 32
TOKENS_PER_ITERATION = 64          # NeuronCore-v2: units are tokens


def units_per_iteration(units: int, nc_version: int) -> int:
    """Units issued per loop iteration: the largest divisor of the bucket's ``units`` that is at
    most the target's block size (so the last block never leaves the bucket)."""
    limit = TILES_PER_ITERATION if nc_version >= 3 else TOKENS_PER_ITERATION
    best = 1
    for d in range(1, min(units, limit) + 1):
        if units % d == 0:
            best = d
    return best


def _in_blocks(units, counts, column, load_slots, unit, turn=1, first=0):
    """Run ``unit(i, slot)`` for the bucket's units, the slots of a block loaded by one DMA
    (``load_slots(block, per)`` -> [n, per], column k for the block's k-th unit): all units
    statically when they fit one block, else a device loop over the blocks holding real units
    (``counts[column]`` of them). ``turn``, ``first``: only a block's units k = first, first +
    turn, ... (a core's turns; ``turn`` divides the block)."""
    per = units_per_iteration(units, nisa.get_nc_version())

    def block(j):
        slot = load_slots(j, per)
        for k in range(first, per, turn):
            unit(j * per + k, slot[:, k:k + 1])

    if per == units:
        block(0)
        return
    count_sb = nl.ndarray((1, 2), nl.int32, buffer=nl.sbuf, name="counts")
    nisa.dma_copy(dst=count_sb, src=counts)
    real = nisa.scalar_load(count_sb[0:1, column:column + 1])
    nl.fori_loop(0, (real + (per - 1)) // per, block)


def _load_slots(slots, block, per, n):
    """Slots of units [block * per, (block + 1) * per) of n tokens each as an [n, per] tile:
    element (p, k) is token p of the block's unit k."""
    blocks = slots.reshape((slots.shape[0] // (per * n), per * n))
    tile = nl.ndarray((n, per), nl.int32, buffer=nl.sbuf, name="slot_sb")
    nisa.dma_copy(dst=tile, src=blocks.ap([[1, n], [n, per]], scalar_offset=block,
                                          indirect_dim=0))
    return tile


def _scatter_tile(i, slot, src_tiles, n, token_elems, token_pattern, limit):
    """Tile i (its slots in ``slot`` [n, 1]): one indirect HBM-to-HBM write per K / V (rows of
    padded or skipped tokens are neither read nor written), or SBUF to HBM when quantized."""
    for target in src_tiles:
        src, rows, offset, inv = target
        row_elems = rows.shape[1]
        dst = rows.ap([[row_elems, n]] + list(token_pattern), offset=offset,
                      vector_offset=slot, indirect_dim=0)
        rows_in = src.ap([[token_elems, n], [1, token_elems]], scalar_offset=i, indirect_dim=0)
        if inv is not None:
            rows_in = _quantized(rows_in, inv, rows.dtype, n, token_elems, limit)
        nisa.dma_copy(dst=dst, src=rows_in, oob_mode=nisa.oob_mode.skip)


def _scatter_tile_pair(i, slot, src_tiles, n, token_elems, token_pattern, v_offset,
                       real_tiles):
    """Tile i of a fused cache (its slots in ``slot`` [n, 1]): its K and V rows loaded side by
    side into one SBUF tile [n, 2 * token_elems] by two DMAs, then written by ONE indirect DMA
    whose destination pairs each token's K row with its V row ``v_offset`` elements on. A tile
    past the ``real_tiles`` holding real tokens loads nothing (its offset out of bounds,
    skipped) and writes nothing (its slots skip); a real tile's padded rows are loaded, not
    written."""
    rows = src_tiles[0][1]
    tiles = src_tiles[0][0].shape[0]
    row = i + (i >= real_tiles) * tiles
    kv = nl.ndarray((n, 2 * token_elems), rows.dtype, buffer=nl.sbuf, name="kv_tile")
    for k in range(2):
        src = src_tiles[k][0]
        nisa.dma_copy(dst=kv[:, k * token_elems:(k + 1) * token_elems],
                      src=src.ap([[token_elems, n], [1, token_elems]], scalar_offset=row,
                                 indirect_dim=0), oob_mode=nisa.oob_mode.skip)
    dst = rows.ap([[rows.shape[1], n], [v_offset, 2]] + list(token_pattern), offset=0,
                  vector_offset=slot, indirect_dim=0)
    nisa.dma_copy(dst=dst, src=kv, oob_mode=nisa.oob_mode.skip)


def _scatter_token(t, slot, targets, token_pattern, token_elems, limit):
    """Token t (its slot in ``slot`` [1, 1]): its K and V rows HBM to HBM at that slot (through
    SBUF when quantized)."""
    for target in targets:
        src, rows, offset, inv = target
        dst = rows.ap([[0, 1]] + list(token_pattern), offset=offset, scalar_offset=slot,
                      indirect_dim=0)
        rows_in = src.ap([[token_elems, 1], [1, token_elems]], scalar_offset=t, indirect_dim=0)
        if inv is not None:
            rows_in = _quantized(rows_in, inv, rows.dtype, 1, token_elems, limit)
        nisa.dma_copy(dst=dst, src=rows_in, oob_mode=nisa.oob_mode.skip)


def packed_parts(tokens: int, heads: int) -> int:
    """Parts each token's K (and V) is split into when a fused cache's K and V rows of a bucket
    of ``tokens`` go out in one DMA (``_scatter_packed``): the most whole groups of heads that
    keep 2 x tokens x parts rows on the 128 partitions (more partitions, more DMA engines);
    0 when K and V together need more than 128 partitions."""
    fits = [p for p in range(1, heads + 1) if heads % p == 0 and 2 * tokens * p <= P_MAX]
    return max(fits, default=0)


def _scatter_packed(rows, key, value, sub_slots, token_pattern, parts):
    """A fused cache, tokens T with 2 * T * parts <= 128 (NeuronCore-v3+): K and V staged in one
    SBUF tile and written by ONE indirect DMA (two DMAs to one tensor run one after the other).
    Partition (kv, t, j) holds part j of token t's K (kv 0) or V (kv 1): heads [j, j + 1) *
    H / parts, its destination row ``sub_slots`` [2 * T * parts, 1] (host-made, in rows of D
    elements: layout.packed_slots; out-of-bounds rows skipped). ``rows``: the cache as rows."""
    T, H, D = key.shape
    n = T * parts
    part_elems = H * D // parts
    pattern, _ = split_token_pattern(token_pattern, parts)
    kv = nl.ndarray((2 * n, part_elems), key.dtype, buffer=nl.sbuf, name="kv_rows")
    sources = (key, value)
    for k in range(2):
        nisa.dma_copy(dst=kv[k * n:(k + 1) * n, :], src=sources[k].reshape((n, part_elems)))
    slot = nl.ndarray((2 * n, 1), nl.int32, buffer=nl.sbuf, name="sub_slots")
    nisa.dma_copy(dst=slot, src=sub_slots)
    flat = rows.reshape((rows.shape[0] * rows.shape[1] // D, D))
    nisa.dma_copy(dst=flat.ap([[D, 2 * n]] + pattern, offset=0, vector_offset=slot,
                              indirect_dim=0),
                  src=kv, oob_mode=nisa.oob_mode.skip)
