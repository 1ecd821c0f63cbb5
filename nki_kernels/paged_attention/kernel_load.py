"""Load one chunk of a request's K and V from the paged cache into SBUF (tokens on partitions).

Only the request's own tokens are read. Two paths, both driven by the cursor of kernel_cursor.py:

- ``load_chunk_indirect`` (NeuronCore-v3+): each token's cache row is computed on device and one
  indirect DMA per K / V gathers the chunk; tokens outside [W, L) get row -1, skipped by
  ``oob_mode.skip`` (their tile rows are zeroed first). Row ids are computed on VectorE's fp32
  ALU, so this path is used when the cache has fewer than 2**24 rows (``ROW_LIMIT``).
- ``load_chunk_pages`` (NeuronCore-v2, and larger caches): one DMA per page (or 128-token piece of
  a page) of the chunk, K and V together for a fused cache, addressed by a ``scalar_offset`` that the DMA engine multiplies out, so any
  cache size is exact; pieces outside [W, L) are skipped and the unused rows of a partly used page
  are zeroed after the load.
"""

from __future__ import annotations

from typing import NamedTuple

from nki_kernels.backend import nisa, nl
from nki_kernels.kernel_dtypes import dtype_bytes

from .kernel_cursor import advance, drop_invalid

ROW_LIMIT = 2 ** 24      # fp32 represents every integer below this exactly


def load_chunk_indirect(tiles, sources, kv_indices, cursor, valid_t, geo, row=None, zeros=None,
                        dropped=False, parts=(0, 1)):
    """tiles: K and V [T, H*D] in SBUF (K as K^T [D, H, T] when ``geo.kt_dma``); sources: (rows
    [R, D] @ HBM, element offset) per tile; row: the chunk's [T, 1] cache rows when
    ``block_rows`` made them, else made here; zeros: ``zero_rows``, copied by ScalarE over a
    tile whose skipped rows must read 0 (VectorE is the busier engine of masked chunks), or
    None (a VectorE memset); ``dropped``: ``row`` already skips the tokens outside the keys
    (``valid_t`` None), the V tile is zeroed all the same; ``parts``: the tiles gathered (0 K,
    1 V: a static pass gathers a chunk's V after the next chunk's K)."""
    T, D = geo.T, geo.D
    if row is None:
        row = _chunk_rows(kv_indices, cursor, geo)
    if valid_t is not None:
        drop_invalid(row, row, valid_t)
    for i in parts:
        tile = tiles[i]
        rows, offset = sources[i]
        if len(tile.shape) == 3:        # K^T: skipped columns keep stale keys, masked anyway
            src = rows.ap([[D, T], [D, geo.H], [1, D]], offset=offset,
                          vector_offset=transpose_rows(row), indirect_dim=0)
            nisa.dma_transpose(dst=tile, src=src, oob_mode=nisa.oob_mode.skip)
            continue
        if valid_t is not None or dropped:            # skipped rows must read as 0, not NaN
            words = word_view(tile)
            if zeros is not None:
                nisa.activation(dst=words, op=nl.copy,
                                data=zeros[0:words.shape[0], 0:words.shape[1]])
            else:
                nisa.memset(dst=words, value=0.0)
        src = rows.ap([[D, T]] + list(geo.token_pattern), offset=offset, vector_offset=row,
                      indirect_dim=0)
        nisa.dma_copy(dst=tile, src=src, oob_mode=nisa.oob_mode.skip)


def _chunk_rows(kv_indices, cursor, geo):
    """[T, 1] int32 cache row of each token of the cursor's chunk. The chunk starts on a page
    boundary (or inside one page), so one DMA at its first slot (a scalar offset: hardware DGE on
    v3+) repeats each of its nslots page ids on span partitions: no per-token gather."""
    T = geo.T
    span, nslots, _ = piece(geo)
    page = nl.ndarray((T, 1), nl.int32, buffer=nl.sbuf, name="page")
    nisa.dma_copy(dst=page, src=kv_indices.ap([[1, nslots], [0, span], [1, 1]],
                                              scalar_offset=cursor["slot"][0:1, :], indirect_dim=0))
    row = nl.ndarray((T, 1), nl.int32, buffer=nl.sbuf, name="row")
    nisa.tensor_scalar(dst=row, data=cursor["entry"], op0=nl.multiply, operand0=geo.entry_stride)
    nisa.tensor_scalar(dst=page, data=page, op0=nl.multiply, operand0=geo.rows_per_page, op1=nl.add,
                       operand1=row)
    return page


def kt_dma_layout(indirect, k_dtype, mm_dtype, T, D, H, entry_stride, token_pattern):
    """Whether K comes transposed by its gather (an indirect ``dma_transpose``, NeuronCore-v3+:
    2-byte K already in the matmul dtype, chunks of a multiple of 16 tokens, D <= 128, a token's
    heads one run of H*D and a page's tokens one after another, so a grouped gather's tokens and
    heads are one [rows, D] level): no TensorE transposes of K and no PSUM evictions of K^T."""
    return (indirect and dtype_bytes(k_dtype) == 2 and k_dtype == mm_dtype and T % 16 == 0
            and D <= 128 and entry_stride == H and len(token_pattern) == 1
            and tuple(token_pattern[0]) == (1, H * D))


def zero_rows(T, width, dtype):
    """A [T, width] SBUF tile of zeros (as ``word_view`` sees it: fp32 words when its bytes
    allow), set once per launch (VectorE: GpSimd sets the identity state that the launch's
    first DMA writes)."""
    zeros = word_view(nl.ndarray((T, width), dtype, buffer=nl.sbuf, name="zero_rows"))
    nisa.memset(dst=zeros, value=0.0, engine=nisa.engine.vector)
    return zeros


def word_view(tile):
    """``tile`` ([P, n] SBUF) seen as fp32 words when its element is narrower and its row is a
    whole number of words: zeroing it (all bits 0 in every float format) then takes an
    instruction over a half (2-byte) or a quarter (1-byte) of the elements."""
    width = tile.shape[-1] * dtype_bytes(tile.dtype)
    if dtype_bytes(tile.dtype) >= 4 or width % 4 or len(tile.shape) != 2:
        return tile
    return tile.view(nl.float32)


def transpose_rows(row):
    """The uint32 [T, 1] row indices a gather-transpose takes (``row``: int32 from
    ``_chunk_rows`` or ``block_rows``, DROPPED where a token is skipped): a dropped row becomes
    ROW_LIMIT, past the end of any cache this path reads (fewer than ROW_LIMIT rows)."""
    if row.dtype == nl.uint32:
        return row
    out = nl.ndarray(row.shape, nl.uint32, buffer=nl.sbuf, name="row_u32")
    lift = nl.ndarray(row.shape, nl.int32, buffer=nl.sbuf, name="row_lift")
    nisa.tensor_scalar(dst=lift, data=row, op0=nl.less, operand0=0, op1=nl.multiply,
                       operand1=2 * ROW_LIMIT)
    nisa.tensor_tensor(dst=out, data1=row, data2=lift, op=nl.add)
    return out


class KTTile(NamedTuple):
    """One chunk's K transposed by its gather (``kt_dma_layout``): head h's K^T [D, T] is
    ``tile[:, base + h, :]`` of a [D, heads x chunks, T] SBUF tile."""

    tile: object
    base: int

    def head(self, h):
        return self.tile[:, self.base + h, :]


class KVTile(NamedTuple):
    """One chunk's K or V in SBUF: T tokens on partitions; head h's D elements start at column
    ``base + h * head_stride`` of ``tile`` (a chunk of its own: base 0, stride D; one of the
    ``group`` chunks of a grouped gather: see ``gather_layout``)."""

    tile: object
    base: int
    head_stride: int

    def head(self, h, d0, dp):
        col = self.base + h * self.head_stride + d0
        return self.tile[:, col:col + dp]


class PackedKT(NamedTuple):
    """K^T views of several requests' chunks packed into one tile of score rows
    (``kernel.packed_requests``): virtual head h is request h // heads's head h % heads."""

    parts: tuple
    heads: int

    def head(self, h):
        return self.parts[h // self.heads].head(h % self.heads)


class PackedKV(NamedTuple):
    """K or V views (``KVTile``) of several requests' chunks packed into one tile of score rows:
    virtual head h is request h // heads's head h % heads."""

    parts: tuple
    heads: int

    @property
    def tile(self):
        return self.parts[0].tile

    def head(self, h, d0, dp):
        return self.parts[h // self.heads].head(h % self.heads, d0, dp)


def converted_v(views, dtype):
    """V views of one loaded tile in ``dtype`` (OCP fp8 is a matmul input from NeuronCore-v4
    only): the tile's V columns, from the lowest view's base to its end (the whole tile, or the
    second half of a fused K+V load), copied by one instruction, the views re-based onto it."""
    tile = views[0].tile
    lo = views[0].base
    for v in views:
        lo = min(lo, v.base)
    v_mm = nl.ndarray((tile.shape[0], tile.shape[1] - lo), dtype, buffer=nl.sbuf, name="v_mm")
    nisa.tensor_copy(dst=v_mm, src=tile[:, lo:])
    out = []
    for v in views:
        out.append(KVTile(v_mm, v.base - lo, v.head_stride))
    return out


# SBUF bytes per partition of one grouped K (or V) gather, by whether a token's heads are one run
# (NHD: a partition's tokens are one run whatever the group, so a small group keeps each loop
# iteration's pipeline fill short) or one run per head (HND: every doubling halves the software-
# DGE descriptors that bound the gather). Decode 32 x 4096 bf16 on trn2, scheduled: HND 4720 us
# at 8 KiB, 3208 at 16, 2995 at 32; NHD 2711 at 8, 2784 at 16.
ONE_RUN_GROUP_BYTES = 8192          # a token's heads are one run (NHD)
PER_HEAD_GROUP_BYTES = 32768        # one run per head (HND)
PSUM_BANK_BYTES = 2048       # per partition: a softmax step's fp32 scores fit one bank


def group_size(geo, count, elem_bytes):
    """Tokens per partition of one gather of a mask-free block of ``count`` chunks: the largest
    power of two dividing ``count`` and the page size (a partition's tokens are consecutive
    entries of one page, so they are one contiguous run per head, or one run in all for NHD)
    whose K tile fits ONE_RUN_GROUP_BYTES or PER_HEAD_GROUP_BYTES, by its layout. 1 when the
    token layout is neither NHD- nor HND-like. A gather is folded in softmax steps of ``step_chunks`` chunks."""
    if len(geo.token_pattern) > 2 or geo.page_size > 128:
        return 1
    limit = ONE_RUN_GROUP_BYTES if len(geo.token_pattern) == 1 else PER_HEAD_GROUP_BYTES
    g = 1
    while (count % (2 * g) == 0 and geo.page_size % (2 * g) == 0
           and 2 * g * geo.H * geo.D * elem_bytes <= limit):
        g *= 2
    return g


def step_chunks(geo, group):
    """Chunks of a grouped gather folded per softmax step: the largest power of two (so it
    divides the power-of-two ``group``) whose fp32 scores [rows, chunks * T] fit one PSUM bank
    (4 x 128 keys), at most ``group``."""
    w = 1
    while 2 * w <= group and 2 * w * geo.T * 4 <= PSUM_BANK_BYTES:
        w *= 2
    return w


def gather_layout(geo, group, kv_step=0):
    """How a gather of ``group`` consecutive entries per partition lays a partition out:
    (per-partition DMA levels, ordered by falling stride so the elements form as few runs as
    possible; tile column of token g's start per g; of head h per h; where V starts, when
    ``kv_step`` (V's element offset after K in a fused cache) puts K and V in one tile).
    NHD: [V,] tokens, heads x D (one run of K, one of V); HND: [V,] heads, tokens, D (one run of
    group*D per head)."""
    D, es = geo.D, geo.entry_stride
    unsorted = [(es * D, group, "tok")]
    if kv_step:
        unsorted.append((kv_step, 2, "kv"))
    pattern = geo.token_pattern
    if len(pattern) == 1:                               # a token's heads are one run (NHD)
        unsorted.append((pattern[0][0], pattern[0][1], "hd"))
    else:
        unsorted.append((pattern[0][0], pattern[0][1], "head"))
        unsorted.append((pattern[1][0], pattern[1][1], "d"))
    tagged = []                                         # by falling stride, stable
    for level in unsorted:
        at = len(tagged)
        while at > 0 and tagged[at - 1][0] < level[0]:
            at -= 1
        tagged.insert(at, level)
    cols, size = {}, 1
    for k in range(len(tagged) - 1, -1, -1):
        cols[tagged[k][2]] = size
        size *= tagged[k][1]
    levels = []
    for level in tagged:
        levels.append([level[0], level[1]])
    return (levels, cols["tok"], D if "hd" in cols else cols["head"],
            cols["kv"] if "kv" in cols else 0)


def group_entry_rows(tok_tab, geo, group):
    """[T, 1] int32: the row offset inside its page of partition p's first token in a grouped
    gather, ((p * group) % P) * entry_stride, read from the host token table (once per launch)."""
    T, P = geo.T, geo.page_size
    rows = nl.ndarray((T, 1), nl.int32, buffer=nl.sbuf, name="group_entry")
    nisa.dma_copy(dst=rows, src=tok_tab.ap([[0, T * group // P], [2 * group, P // group], [1, 1]],
                                           offset=1))
    nisa.tensor_scalar(dst=rows, data=rows, op0=nl.multiply, operand0=geo.entry_stride)
    return rows


def block_rows(kv_indices, cursor, count, geo, group, entry_rows, moves=True, unsigned=True):
    """[T, count // group] int32 cache rows of the first token of each partition for the
    cursor's next ``count`` whole-page chunks (P <= 128) gathered ``group`` tokens per partition
    (column q: tokens q*T*group + p*group ..), made with one page-id DMA and one VectorE
    instruction for the whole block, so no gather waits on a page-id load behind the previous
    gathers. ``entry_rows``: ``group_entry_rows``. Advances the cursor past the block when it
    ``moves`` (a cursor of the block's first slot alone, ``{"slot": ...}``, does not); int32
    rows unless ``unsigned`` and gathered transposed (uint32 indices, ``geo.kt_dma``)."""
    rows = rows_of_pages(block_pages(kv_indices, cursor, count, geo, group), geo, entry_rows,
                         unsigned)
    if moves:
        advance(cursor, geo.page_size, count)
    return rows


def block_pages(kv_indices, cursor, count, geo, group):
    """[T, count // group] int32 page ids of ``block_rows``' partitions (one DMA from the page
    list at the cursor's slot): the first half of ``block_rows``."""
    T, P = geo.T, geo.page_size
    n = count // group
    per = T * group // P                   # pages per gather
    pages = nl.ndarray((T, n), nl.int32, buffer=nl.sbuf, name="block_pages")
    nisa.dma_copy(dst=pages, src=kv_indices.ap([[1, per], [0, P // group], [per, n]],
                                               scalar_offset=cursor["slot"][0:1, :],
                                               indirect_dim=0))
    return pages


def rows_of_pages(pages, geo, entry_rows, unsigned=True):
    """The cache rows of ``block_pages``' page ids (their second half of ``block_rows``)."""
    rows = pages
    if geo.kt_dma and unsigned:     # a gather-transpose's indices are uint32 (all valid here)
        rows = nl.ndarray(pages.shape, nl.uint32, buffer=nl.sbuf, name="block_rows")
    nisa.tensor_scalar(dst=rows, data=pages, op0=nl.multiply, operand0=geo.rows_per_page,
                       op1=nl.add, operand1=entry_rows)
    return rows


def load_group_indirect(sources, row, geo, group, mm_dtype=None):
    """Gather ``group`` chunks, ``group`` consecutive tokens per partition (row: [T, 1] cache
    row of each partition's first token), as K and V tiles [T, group*H*D]; returns, per chunk
    g, its (K, V) KVTile pair (chunk g = token g of every partition: an order of the block's
    tokens, which mask-free softmax steps do not depend on). V is converted to ``mm_dtype``
    when given. Rows past the cache (a null item's, work.NullItems) are skipped."""
    T, D, H = geo.T, geo.D, geo.H
    levels, token_cols, head_cols, _ = gather_layout(geo, group)
    tiles = []
    for i in range(len(sources)):
        rows, offset = sources[i]
        if i == 0 and geo.kt_dma:        # K^T [D, group*H, T]: chunk g's head h at g*H + h
            kt = nl.ndarray((D, group * H, T), rows.dtype, buffer=nl.sbuf, name="kT_group")
            nisa.dma_transpose(dst=kt, src=rows.ap([[D, T], [D, group * H], [1, D]],
                                                   offset=offset, vector_offset=transpose_rows(row),
                                                   indirect_dim=0), oob_mode=nisa.oob_mode.skip)
            tiles.append(kt)
            continue
        name = ("k_group", "v_group")[i]
        tile = nl.ndarray((T, group * H * D), rows.dtype, buffer=nl.sbuf, name=name)
        nisa.dma_copy(dst=tile, src=rows.ap([[D, T]] + levels, offset=offset, vector_offset=row,
                                            indirect_dim=0), oob_mode=nisa.oob_mode.skip)
        tiles.append(tile)
    return _pairs(tiles[0], tiles[1], 0, token_cols, head_cols, group, mm_dtype)


def _pairs(k_tile, v_tile, v_base, token_cols, head_cols, group, mm_dtype):
    """[(K, V)] per chunk g < group of a grouped gather (chunk g's heads from column
    ``g * token_cols``, V's from ``v_base`` on), V converted to ``mm_dtype`` when given."""
    k_views, v_views = [], []
    for g in range(group):
        if len(k_tile.shape) == 3:       # K^T by its gather: heads of chunk g from g*H on
            k_views.append(KTTile(k_tile, g * (k_tile.shape[1] // group)))
        else:
            k_views.append(KVTile(k_tile, g * token_cols, head_cols))
        v_views.append(KVTile(v_tile, v_base + g * token_cols, head_cols))
    if mm_dtype is not None:
        v_views = converted_v(v_views, mm_dtype)
    pairs = []
    for g in range(group):
        pairs.append((k_views[g], v_views[g]))
    return pairs


def piece(geo):
    """(tokens per DMA, pieces per chunk, pieces per page): a whole page when P <= 128, else a
    128-token piece of one."""
    span = min(geo.page_size, geo.T)
    return span, geo.T // span, geo.page_size // span


def load_chunk_pages(tiles, sources, kv_indices, cursor, bounds, valid_t, geo):
    """Gather the cursor's chunk into ``tiles``: K and V [T, H*D], or, for a fused cache (both
    sources one tensor), one tile [T, 2*H*D] with a token's K then V elements, so each page
    costs one DMA for both. ``valid_t`` None: a full chunk (every token belongs to the request),
    nothing to mask."""
    T, D, es = geo.T, geo.D, geo.entry_stride
    span, nslots, per_page = piece(geo)
    # elements per piece (the scalar offset's unit): a whole page, or 128 entries of one
    unit = geo.rows_per_page * D if per_page == 1 else span * es * D
    pid = page_ids(kv_indices, cursor, nslots)
    if per_page > 1:                         # piece id = page * pieces per page + entry // 128
        units = geo.rows_per_page * D // unit
        sub = nl.ndarray((1, 1), nl.int32, buffer=nl.sbuf, name="sub_piece")
        nisa.tensor_scalar(dst=sub, data=cursor["entry"][0:1, :], op0=nl.divide, operand0=span)
        nisa.tensor_scalar(dst=pid, data=pid, op0=nl.multiply, operand0=units, op1=nl.add,
                           operand1=sub)
    if len(tiles) == 1:                      # fused: V is sources[1]'s offset after K
        (rows, k_off), (_, v_off) = sources
        targets = [(tiles[0], rows, k_off, [[v_off - k_off, 2]] + list(geo.token_pattern))]
    else:
        targets = []
        for i in range(len(tiles)):
            targets.append((tiles[i], sources[i][0], sources[i][1], list(geo.token_pattern)))
    width = tiles[0].shape[1]
    if valid_t is not None:
        _drop_pieces_outside(pid, cursor, bounds, span, nslots)
        pred = nl.ndarray((T, width), nl.uint8, buffer=nl.sbuf, name="pred")
        nisa.memset(dst=pred, value=0)
        nisa.tensor_scalar(dst=pred, data=pred, op0=nl.add, operand0=valid_t)
    for target in targets:
        tile, rows, offset, pattern = target
        pieces = rows.reshape((rows.shape[0] * D // unit, unit))
        raw = tile                                   # a full chunk: every row is loaded
        if valid_t is not None:
            raw = nl.ndarray((T, width), tile.dtype, buffer=nl.sbuf, name="kv_raw")
            nisa.memset(dst=raw, value=0.0)
        for j in range(nslots):
            src = pieces.ap([[es * D, span]] + pattern, offset=offset,
                            scalar_offset=pid[0:1, j:j + 1], indirect_dim=0)
            nisa.dma_copy(dst=raw[j * span:(j + 1) * span, :], src=src, oob_mode=nisa.oob_mode.skip)
        if valid_t is not None:
            nisa.memset(dst=tile, value=0.0)
            nisa.tensor_copy_predicated(dst=tile, src=raw, predicate=pred)


def block_page_ids(kv_indices, cursor, count, geo):
    """[1, pages] int32 page ids of the cursor's next ``count`` whole-page chunks (P <= 128), one
    DMA for the block; advances the cursor past it."""
    pid = page_ids(kv_indices, cursor, count * geo.T // geo.page_size)
    advance(cursor, geo.page_size, count)
    return pid


def page_ids(kv_indices, cursor, count):
    """[1, count] int32: ``count`` page ids from the cursor's slot on, one DMA."""
    pid = nl.ndarray((1, count), nl.int32, buffer=nl.sbuf, name="pid")
    nisa.dma_copy(dst=pid, src=kv_indices.ap([[1, 1], [1, count]],
                                             scalar_offset=cursor["slot"][0:1, :], indirect_dim=0))
    return pid


def load_group_pages(sources, pid, first, geo, group, mm_dtype=None):
    """Without indirect DMA (NeuronCore-v2, or caches past ROW_LIMIT): ``group`` mask-free
    chunks, one DMA per page (page ids pid[0, first..]) laying its P tokens on P / group
    partitions, ``group`` consecutive tokens each, K and V of a fused cache in the same DMA: a
    quarter of the descriptors of one token per partition and half the DMAs. Returns, per chunk
    g (token g of every partition), its (K, V) KVTile pair; V converted to ``mm_dtype`` when
    given."""
    T, D, H, P, es = geo.T, geo.D, geo.H, geo.page_size, geo.entry_stride
    unit = geo.rows_per_page * D                       # the scalar offset's unit: one page
    (k_src, k_off), (v_src, v_off) = sources
    fused = k_src is v_src
    levels, token_cols, head_cols, v_cols = gather_layout(geo, group, v_off - k_off if fused else 0)
    width = group * H * D * (2 if fused else 1)
    targets = [(k_src, k_off)] if fused else [(k_src, k_off), (v_src, v_off)]
    tiles = []
    for i in range(len(targets)):
        rows, offset = targets[i]
        name = ("k_group", "v_group")[i]
        tile = nl.ndarray((T, width), rows.dtype, buffer=nl.sbuf, name=name)
        pieces = rows.reshape((rows.shape[0] * D // unit, unit))
        span = P // group                              # partitions per page
        for j in range(T // span):
            nisa.dma_copy(dst=tile[j * span:(j + 1) * span, :],
                          src=pieces.ap([[group * es * D, span]] + levels, offset=offset,
                                        scalar_offset=pid[0:1, first + j:first + j + 1],
                                        indirect_dim=0), oob_mode=nisa.oob_mode.skip)
        tiles.append(tile)
    v_tile = tiles[0] if fused else tiles[1]
    return _pairs(tiles[0], v_tile, v_cols, token_cols, head_cols, group, mm_dtype)


def _drop_pieces_outside(pid, cursor, bounds, span, nslots):
    """pid[j] = -1 for pieces with no token in [W, L) (piece j holds positions start + j*span ..
    start + (j+1)*span - 1)."""
    first = nl.ndarray((1, nslots), nl.int32, buffer=nl.sbuf, name="piece_first")
    nisa.iota(dst=first, pattern=[[span, nslots]], offset=0, channel_multiplier=0)
    nisa.tensor_scalar(dst=first, data=first, op0=nl.add, operand0=cursor["pos"][0:1, :])
    ok = nl.ndarray((1, nslots), nl.int32, buffer=nl.sbuf, name="piece_ok")
    nisa.tensor_scalar(dst=ok, data=first, op0=nl.less, operand0=bounds.L_t[0:1, :])
    if bounds.W_t is None:
        drop_invalid(pid, pid, ok)
        return
    last = nl.ndarray((1, nslots), nl.int32, buffer=nl.sbuf, name="piece_end")
    nisa.tensor_scalar(dst=last, data=first, op0=nl.add, operand0=span - 1,
                       op1=nl.greater_equal, operand1=bounds.W_t[0:1, :])
    nisa.tensor_tensor(dst=ok, data1=ok, data2=last, op=nl.multiply)
    drop_invalid(pid, pid, ok)
