"""Per-kv-head fp8 dequantization scales (``k_scale`` / ``v_scale`` arrays [H]) for attention,
folded on the host around the launch: the kernel takes one scale per tensor.

K: logits of query head h scale by k_scale[h // G], so q's head h is multiplied by it before the
launch (in float32, rounded back to q's dtype: one extra rounding of q). V: the output of head h
is multiplied by v_scale[h // G] after it (the LSE does not depend on V)."""

from __future__ import annotations

import numpy as np

from nki_kernels.paged_cache.layout import geometry
from nki_kernels.paged_cache.quantize import check_scale


def fold_head_scales(q, paged_kv_cache, kv_layout, k_scale, v_scale):
    """(q, k_scale, v_scale, per-query-head output factors [HQ] or None): arrays folded, numbers
    passed through unchanged."""
    if not isinstance(k_scale, np.ndarray) and not isinstance(v_scale, np.ndarray):
        return q, k_scale, v_scale, None
    H = geometry(paged_kv_cache, kv_layout).num_heads
    if not isinstance(q, np.ndarray) or q.ndim != 3 or q.shape[1] % H:
        return q, k_scale, v_scale, None       # the launch's own checks name the problem
    G = q.shape[1] // H
    post = None
    if isinstance(k_scale, np.ndarray):
        per_q = query_head_factors("k_scale", k_scale, H, G)
        q = (q.astype(np.float32) * per_q[None, :, None]).astype(q.dtype)
        k_scale = 1.0
    if isinstance(v_scale, np.ndarray):
        post = query_head_factors("v_scale", v_scale, H, G)
        v_scale = 1.0
    return q, k_scale, v_scale, post


def query_head_factors(name, scale, num_kv_heads, group):
    """float32 [HQ]: kv head h // G's scale for query head h (``scale``: an array [H], checked
    by name)."""
    return np.repeat(check_scale(name, scale, num_kv_heads), group)


def scale_heads(out, post):
    """out [rows, HQ, D] times the per-head factors (None: unchanged)."""
    if post is None:
        return out
    return (out.astype(np.float32) * post[None, :, None]).astype(out.dtype)
