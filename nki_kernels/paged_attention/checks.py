"""Input rules of batch_decode and batch_prefill, checked on the host; return what the plans
and the references need."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from nki_kernels.paged_cache.checks import PageTable, csr_counts, page_table, require_int32_vector
from nki_kernels.paged_cache.layout import CacheGeometry, geometry, split_cache
from nki_kernels.paged_cache.quantize import check_scale

from .work import MAX_KV_LEN

Q_DTYPES = ("float32", "float16", "bfloat16")
KV_DTYPES = Q_DTYPES + ("float8_e4m3fn", "float8_e5m2", "float8_e4m3")


@dataclass(frozen=True)
class DecodeProblem:
    geo: CacheGeometry
    batch: int
    num_qo_heads: int
    group: int                     # num_qo_heads // num_kv_heads
    table: PageTable               # the checked page table (kv_lens: [B] int64 keys)
    sm_scale: float

    @property
    def kv_lens(self) -> np.ndarray:
        return self.table.kv_lens


MAX_GROUP = 128          # query heads per kv head: one tile's partitions
MAX_HEAD_DIM = 512       # the matmul's largest moving free size


def soft_cap(value):
    """``logits_soft_cap`` with None meaning no cap (FlashInfer's default)."""
    return 0.0 if value is None else value


def check_batch_decode_inputs(q, paged_kv_cache, kv_indptr, kv_indices, kv_last_page_len, kv_layout,
                              sm_scale, logits_soft_cap, window_left, sinks, k_scale, v_scale,
                              batch=None):
    """``batch``: requests in the page table (default q's rows: one query per request)."""
    geo = geometry(paged_kv_cache, kv_layout)
    k_cache = split_cache(paged_kv_cache)[0]
    if not isinstance(q, np.ndarray) or q.ndim != 3:
        raise ValueError(f"q must be a 3-D array [batch, num_qo_heads, head_dim], got {getattr(q, 'shape', type(q).__name__)}")
    if q.dtype.name not in Q_DTYPES:
        raise TypeError(f"q dtype {q.dtype} must be one of {Q_DTYPES}")
    if k_cache.dtype.name not in KV_DTYPES:
        raise TypeError(f"cache dtype {k_cache.dtype} must be one of {KV_DTYPES}")
    rows, hq, d = q.shape
    source = "" if batch is not None else f"; q has {rows} rows, one per request"
    batch = rows if batch is None else batch
    if d != geo.head_dim:
        raise ValueError(f"q head_dim {d} != cache head_dim {geo.head_dim}")
    if hq % geo.num_heads:
        raise ValueError(f"num_qo_heads={hq} must be a multiple of num_kv_heads={geo.num_heads}")
    if hq // geo.num_heads > MAX_GROUP:
        raise ValueError(f"num_qo_heads / num_kv_heads = {hq // geo.num_heads}: a kv head's query "
                         f"group must fit the {MAX_GROUP} partitions of a tile")
    if d > MAX_HEAD_DIM:
        raise ValueError(f"head_dim={d} exceeds {MAX_HEAD_DIM} (the largest matmul free size)")
    require_int32_vector("kv_indptr", kv_indptr, batch + 1, f"batch + 1{source}")
    require_int32_vector("kv_indices", kv_indices)
    require_int32_vector("kv_last_page_len", kv_last_page_len, batch, f"batch{source}")
    table = page_table(kv_indptr, kv_indices, kv_last_page_len, geo)
    kv_lens = table.kv_lens
    if kv_lens.size and kv_lens.max() > MAX_KV_LEN:
        b = int(np.argmax(kv_lens))
        raise ValueError(f"request {b} has {kv_lens[b]} keys (kv_indptr / kv_last_page_len): at "
                         f"most {MAX_KV_LEN} (2**24 - 1; the kernel's positions are exact in fp32 "
                         f"below 2**24)")
    if sm_scale is None:
        sm_scale = 1.0 / np.sqrt(d)
    for name, value in (("sm_scale", sm_scale), ("logits_soft_cap", logits_soft_cap),
                        ("k_scale", k_scale), ("v_scale", v_scale)):
        if name in ("k_scale", "v_scale") and isinstance(value, np.ndarray):
            check_scale(name, value, geo.num_heads)        # one per kv head: checked there
            continue
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer,
                                                                          np.floating)):
            raise TypeError(f"{name}={value!r} must be a real number, got {type(value).__name__}")
    if not np.isfinite(sm_scale) or sm_scale <= 0:
        raise ValueError(f"sm_scale={sm_scale} must be a positive finite number")
    if not np.isfinite(logits_soft_cap) or logits_soft_cap < 0:
        raise ValueError(f"logits_soft_cap={logits_soft_cap} must be >= 0 (0 disables it)")
    if not isinstance(window_left, (int, np.integer)) or window_left < -1:
        raise ValueError(f"window_left={window_left} must be an integer >= -1 (-1 disables the window)")
    for name, s in (("k_scale", k_scale), ("v_scale", v_scale)):
        if not isinstance(s, np.ndarray):
            check_scale(name, s, 1)
    if sinks is not None:
        if not isinstance(sinks, np.ndarray) or sinks.shape != (hq,):
            raise ValueError(f"sinks must be an array of shape (num_qo_heads,) = ({hq},)")
        if not np.isfinite(sinks.astype(np.float64)).all():
            raise ValueError("sinks must be finite")
    return DecodeProblem(geo, batch, hq, hq // geo.num_heads, table, float(sm_scale))


def check_qo_indptr(qo_indptr, batch, total_q) -> np.ndarray:
    """Each request's query count (int64 [B]) from the CSR offsets, refusing bad ones by name."""
    require_int32_vector("qo_indptr", qo_indptr, batch + 1)
    q_lens = csr_counts("qo_indptr", qo_indptr)
    if qo_indptr[-1] != total_q:
        raise ValueError(f"qo_indptr[-1]={qo_indptr[-1]} must equal q's rows ({total_q})")
    return q_lens


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
