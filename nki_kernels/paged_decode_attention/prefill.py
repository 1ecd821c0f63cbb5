"""``batch_prefill``: ragged query tokens over a paged KV cache (FlashInfer
BatchPrefillWithPagedKVCacheWrapper semantics): speculative verification, chunked prefill and
mixed prefill/decode batches, through the decode kernel with blocks of query tokens per work item.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from nki_kernels.buckets import bucket
from nki_kernels.launch_options import check_lnc
from nki_kernels.paged_kv_append.checks import csr_counts, require_int32_vector
from nki_kernels.paged_kv_append.layout import check_writable

from .checks import check_batch_decode_inputs, soft_cap
from .decode import cache_rows, kernel_arguments, table_capacity
from .head_scales import fold_head_scales, scale_heads
from .kernel import append_attention_kernel, batch_decode_kernel
from .prefill_append import append_arguments
from .plan import items_per_iteration, query_blocks, split_work, whole_units


def batch_prefill(q, paged_kv_cache, qo_indptr, kv_indptr, kv_indices, kv_last_page_len,
                  kv_layout="NHD", causal=False, sm_scale=None, logits_soft_cap=0.0, window_left=-1,
                  sinks=None, k_scale=1.0, v_scale=1.0, return_lse=False, lnc=1, append_key=None,
                  append_value=None):
    """Attention of each request's new query tokens over its pages (the new tokens' K/V already
    appended: they are the request's last q_len keys).

    Dimensions:  B requests, Q = qo_indptr[-1] query tokens, HQ query heads, H kv heads, D head_dim
    Args:
        q: [Q, HQ, D] fp32 | fp16 | bf16; request b's tokens are rows qo_indptr[b]..qo_indptr[b+1]
        qo_indptr: [B+1] int32 CSR offsets of the query tokens (a request may have none)
        paged_kv_cache, kv_indptr, kv_indices, kv_last_page_len, kv_layout: as ``batch_decode``
        causal: query i of a request with q_len queries and kv_len keys sees keys below
            kv_len - q_len + i + 1 (needs kv_len >= q_len); False (FlashInfer's default): all keys
        window_left: >= 0 keeps keys at or after position kv_len - q_len + i - window_left
            (causal or not, as FlashInfer; any window_left >= kv_len - 1 keeps every key);
            sm_scale, logits_soft_cap, sinks, k_scale, v_scale,
            lnc: as ``batch_decode``
        append_key, append_value: [Q, H, D] in the cache dtype, or None: the new tokens' K/V,
            written into the cache (in place, as ``append_paged_kv_cache`` at each query token's
            position kv_len - q_len + i) by the same launch before attention reads them; wider
            rows into an fp8 cache are quantized on write with k_scale / v_scale (the scales
            attention reads back with; numbers or float arrays [H] per kv head)
    Returns:
        out [Q, HQ, D] in q's dtype; with return_lse also lse [Q, HQ] float32, base 2. Masked
        scores are selected away, never added: a NaN or inf at a key a query does not see never
        reaches that query's output (docs/numerics.md gives the whole NaN semantics).
    Work items are blocks of Qb query tokens of one request (``query_block``: the largest q_len
    rounded up to a power of two while one tile of heads x group x Qb <= 128 score rows holds
    them, else up to 4 such tiles of 128 // group tokens), so each chunk of keys is read once for
    all of them; an item visits only the chunks its queries see.
    Compiles once per (Qb, bucket of work items); q_len == 1 everywhere is ``batch_decode``'s
    launch exactly. A mixed batch (some requests with one query, others with more) runs as two
    launches, the longer requests first (with the whole fused write), then the single queries as
    decode, each bucketed.
    """
    cores = check_lnc(lnc)
    write_scales = (k_scale, v_scale)
    q, k_scale, v_scale, post = fold_head_scales(q, paged_kv_cache, kv_layout, k_scale, v_scale)
    prob, q_lens = check_batch_prefill_inputs(
        q, paged_kv_cache, qo_indptr, kv_indptr, kv_indices, kv_last_page_len, kv_layout, causal,
        sm_scale, logits_soft_cap, window_left, sinks, k_scale, v_scale)
    writes = ()
    if append_key is not None or append_value is not None:
        arrays, write = append_arguments(append_key, append_value, paged_kv_cache, kv_layout,
                                         qo_indptr, kv_indptr, kv_indices, kv_last_page_len,
                                         prob.kv_lens, q.shape[0], *write_scales, lnc=lnc)
        writes = (*arrays, write)
        # every input is read before the write: q (read again by a mixed batch's second launch)
        # and sinks (read at the end of each item) are copied when they view the cache
        q, sinks = (None if a is None else check_writable(paged_kv_cache, (a,))[0]
                    for a in (q, sinks))
    options = (paged_kv_cache, bool(causal), logits_soft_cap, window_left, sinks, k_scale,
               v_scale, cores)
    single = q_lens == 1
    if not (single.any() and (q_lens > 1).any()):
        launch = plan_prefill(prob, q_lens, qo_indptr, kv_indptr, kv_indices, *options)
        out, lse = _run(launch, q, paged_kv_cache, writes, lnc)
        out = scale_heads(out, post)
        return (out, lse) if return_lse else out
    # A mixed batch: the requests with one query run as decode (Qb = 1) after the others, whose
    # launch also writes every new row: blocks of Qb rows would cost them Qb x the tiles. Both
    # launches are planned (everything checked) before the first runs.
    launches = []
    for group, group_writes in ((~single, writes), (single, ())):
        idx = np.flatnonzero(group)
        rows, (qo, ptr, pages) = _sub_batch(idx, qo_indptr, kv_indptr, kv_indices)
        sub = dataclasses.replace(prob, batch=idx.size, kv_lens=prob.kv_lens[idx])
        launches.append((rows, plan_prefill(sub, q_lens[idx], qo, ptr, pages, *options),
                         group_writes))
    out = np.empty(q.shape, q.dtype)
    lse = np.empty(q.shape[:2], np.float32)
    for rows, launch, group_writes in launches:
        out[rows], lse[rows] = _run(launch, q[rows], paged_kv_cache, group_writes, lnc)
    out = scale_heads(out, post)
    return (out, lse) if return_lse else out


def _run(launch, q, paged_kv_cache, writes, lnc):
    """One kernel launch of a prepared batch: out [Q, HQ, D], lse [Q, HQ]."""
    kernel = append_attention_kernel if writes else batch_decode_kernel
    kernel = kernel if lnc == 1 else kernel[lnc]
    out, lse = kernel(launch.pad_queries(q), *cache_rows(paged_kv_cache, q.shape[2]), *writes,
                      *launch.arrays, *launch.statics)
    return launch.unpad(out), launch.unpad(lse)[:, :, 0]


def _sub_batch(idx, qo_indptr, kv_indptr, kv_indices):
    """Requests ``idx`` as a batch of their own: (their q rows, (qo_indptr, kv_indptr,
    kv_indices) of that batch, int32)."""
    q0, q1 = qo_indptr[idx].astype(np.int64), qo_indptr[idx + 1].astype(np.int64)
    p0, p1 = kv_indptr[idx].astype(np.int64), kv_indptr[idx + 1].astype(np.int64)
    rows = np.concatenate([np.arange(a, b) for a, b in zip(q0, q1)] + [np.zeros(0, np.int64)])
    pages = np.concatenate([kv_indices[a:b] for a, b in zip(p0, p1)] + [np.zeros(0, np.int32)])
    indptr = lambda n: np.concatenate([[0], np.cumsum(n)]).astype(np.int32)  # noqa: E731
    return rows, (indptr(q1 - q0), indptr(p1 - p0), pages.astype(np.int32))


def check_qo_indptr(qo_indptr, batch, total_q) -> np.ndarray:
    """Each request's query count (int64 [B]) from the CSR offsets, refusing bad ones by name."""
    require_int32_vector("qo_indptr", qo_indptr, batch + 1)
    q_lens = csr_counts("qo_indptr", qo_indptr)
    if qo_indptr[-1] != total_q:
        raise ValueError(f"qo_indptr[-1]={qo_indptr[-1]} must equal q's rows ({total_q})")
    return q_lens


# SBUF per partition for the per-tile state of a work item (acc [R, D] fp32 and Q^T pieces [Dp, R]
# in 16 bits: about 6 D bytes per tile), which bounds how many tiles of query tokens an item takes
ITEM_TILE_BYTES = 64 * 1024
QUERY_TILES_MAX = 4


def query_block(max_q_len: int, group: int, kv_heads: int = 1, head_dim: int = 128) -> int:
    """Query tokens per work item. While it fits one tile (128 // group tokens: group x Qb score
    rows per kv head), max_q_len rounded up to a power of two; beyond, a power-of-two number of
    whole tiles (at most QUERY_TILES_MAX, and as many as the item's state fits ITEM_TILE_BYTES
    for its kv heads), so an item reads each chunk of keys (and pays each loop barrier) once for
    up to 4 x 128 // group queries."""
    per_tile = max(1, 128 // group)
    qb = 1
    while qb < max_q_len:
        qb *= 2
    if qb <= per_tile:
        return qb
    head_tiles = -(-kv_heads // max(1, 128 // (group * per_tile)))
    fits = ITEM_TILE_BYTES // (6 * head_dim * head_tiles)
    tiles = 1
    while 2 * tiles <= min(QUERY_TILES_MAX, fits) and tiles * per_tile < max_q_len:
        tiles *= 2
    return tiles * per_tile


@dataclass(frozen=True)
class PrefillLaunch:
    """The kernel's arguments after the cache rows, and where each query token sits in the
    padded q (blocks of Qb rows per work item, zero rows past a request's last token)."""

    arrays: tuple
    statics: tuple
    gather: np.ndarray       # [padded rows] int64: the q row copied there, -1 for a zero row
    scatter: np.ndarray      # [Q] int64: the padded row of query token t
    kv_lens: np.ndarray      # [B] int64: each request's keys (from the page table)

    def pad_queries(self, q):
        """q's rows in their padded places, zeros elsewhere (a NumPy array or a torch tensor,
        gathered where it lives)."""
        keep = np.flatnonzero(self.gather >= 0)
        shape = (self.gather.size,) + tuple(q.shape[1:])
        if isinstance(q, np.ndarray):
            out = np.zeros(shape, q.dtype)
            out[keep] = q[self.gather[keep]]
            return out
        import torch
        on = lambda a: torch.from_numpy(a).to(q.device)    # noqa: E731
        out = q.new_zeros(shape)
        out[on(keep)] = q[on(self.gather[keep])]
        return out

    def unpad(self, rows):
        """Query token t's row of a padded kernel output (NumPy or torch)."""
        if isinstance(rows, np.ndarray):
            return rows[self.scatter]
        import torch
        return rows[torch.from_numpy(self.scatter).to(rows.device)]


def prepare_prefill(q, paged_kv_cache, qo_indptr, kv_indptr, kv_indices, kv_last_page_len,
                    kv_layout, causal, sm_scale, logits_soft_cap, window_left, sinks, k_scale,
                    v_scale, cores=1) -> PrefillLaunch:
    """Host half of ``batch_prefill`` as one launch: checks, then ``plan_prefill``. ``q`` and
    the cache may be shape-and-dtype stand-ins; index arrays are host NumPy arrays."""
    prob, q_lens = check_batch_prefill_inputs(
        q, paged_kv_cache, qo_indptr, kv_indptr, kv_indices, kv_last_page_len, kv_layout, causal,
        sm_scale, logits_soft_cap, window_left, sinks, k_scale, v_scale)
    return plan_prefill(prob, q_lens, qo_indptr, kv_indptr, kv_indices, paged_kv_cache,
                        bool(causal), logits_soft_cap, window_left, sinks, k_scale, v_scale, cores)


def plan_prefill(prob, q_lens, qo_indptr, kv_indptr, kv_indices, paged_kv_cache, causal,
                 logits_soft_cap, window_left, sinks, k_scale, v_scale, cores) -> PrefillLaunch:
    """Checked inputs (``prob``, ``q_lens``) -> work items, padded row maps, kernel arguments."""
    qb = query_block(int(q_lens.max(initial=0)), prob.group, prob.geo.num_heads, prob.geo.head_dim)
    items = query_blocks(kv_indptr, prob.kv_lens, q_lens, qb, window_left, causal,
                         prob.geo.page_size)
    n_items = items.L.size
    work = split_work(items, prob.geo.page_size, bucket(n_items), cores,
                      items_per_iteration(qb),
                      table_capacity(prob.geo, kv_indptr), 1 if qb == 1 else bucket(n_items),
                      whole_units(qb))
    # item k covers tokens q0 .. q0 + qb of its request, at padded rows k*qb ..
    tok = items.q0[:, None] + np.arange(qb)[None, :]
    real = tok < q_lens[items.request][:, None]
    gather = np.full((bucket(n_items), qb), -1, np.int64)
    gather[:n_items] = np.where(real, qo_indptr[items.request].astype(np.int64)[:, None] + tok, -1)
    gather = gather.reshape(-1)
    scatter = np.empty(int(q_lens.sum()), np.int64)
    scatter[gather[gather >= 0]] = np.flatnonzero(gather >= 0)
    row_tab = None if qb == 1 else (np.arange(prob.group * qb) // prob.group).astype(
        np.int32).reshape(-1, 1)
    arrays, statics = kernel_arguments(prob, paged_kv_cache, kv_indptr, kv_indices, work, row_tab,
                                       sinks, soft_cap(logits_soft_cap), k_scale, v_scale)
    return PrefillLaunch(arrays, statics, gather, scatter, prob.kv_lens)


def check_batch_prefill_inputs(q, paged_kv_cache, qo_indptr, kv_indptr, kv_indices,
                               kv_last_page_len, kv_layout, causal, sm_scale, logits_soft_cap,
                               window_left, sinks, k_scale, v_scale):
    """(DecodeProblem, q_lens [B] int64); refuses a causal request with fewer keys than queries."""
    if not isinstance(causal, (bool, np.bool_)):
        raise TypeError(f"causal={causal!r} must be a bool")
    batch = np.shape(kv_indptr)[0] - 1 if np.ndim(kv_indptr) == 1 else -1
    prob = check_batch_decode_inputs(q, paged_kv_cache, kv_indptr, kv_indices, kv_last_page_len,
                                     kv_layout, sm_scale, soft_cap(logits_soft_cap), window_left,
                                     sinks, k_scale, v_scale, batch=max(batch, 0))
    q_lens = check_qo_indptr(qo_indptr, prob.batch, q.shape[0])
    if causal:
        short = q_lens > prob.kv_lens
        if short.any():
            b = int(np.flatnonzero(short)[0])
            raise ValueError(f"causal: request {b} has {q_lens[b]} queries (qo_indptr) but "
                             f"{prob.kv_lens[b]} keys (kv_indptr / kv_last_page_len); its new "
                             f"tokens' K/V must be in the cache (kv_len >= q_len)")
    return prob, q_lens
