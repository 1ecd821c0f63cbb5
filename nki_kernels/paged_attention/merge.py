"""Combine attention states computed over disjoint KV parts (base-2 log-sum-exp, as FlashInfer)."""

from __future__ import annotations

import numpy as np


def merge_state(v_a, s_a, v_b, s_b):
    """(v, s) of the union of two KV parts.

    v_*: [..., D] attention outputs; s_*: [...] base-2 LSE of each part.
    s = log2(2^s_a + 2^s_b); v = (v_a 2^s_a + v_b 2^s_b) / 2^s (a part with s = -inf weighs 0).
    """
    v_a, v_b, s_a, s_b = (np.asarray(x) for x in (v_a, v_b, s_a, s_b))
    if v_a.shape != v_b.shape or s_a.shape != s_b.shape or v_a.ndim < 1:
        raise ValueError(f"merge_state: v_a {v_a.shape} / v_b {v_b.shape} and s_a {s_a.shape} / "
                         f"s_b {s_b.shape} must match pairwise")
    return merge_states(np.stack([v_a, v_b], axis=-2), np.stack([s_a, s_b], axis=-1))


def merge_states(v, s):
    """Merge n states: v [..., n, D], s [..., n] (base-2 LSE) -> (v [..., D], s [...]) in float32.

    A part with s = -inf weighs 0 (an empty part); a NaN in a part's s or v makes that merged
    row NaN (it is never silently dropped)."""
    v = np.asarray(v, np.float64)
    s = np.asarray(s, np.float64)
    try:
        if v.ndim < 2 or s.ndim < 1:
            raise ValueError
        np.broadcast_shapes(s.shape, v.shape[:-1])
    except ValueError:
        raise ValueError(f"merge_states: s shape {s.shape} must match (broadcast to) v's shape "
                         f"{v.shape} without its last (head_dim) axis: v [..., n, D], "
                         f"s [..., n]") from None
    bad = np.isnan(s).any(axis=-1) | np.isnan(v).any(axis=(-2, -1))
    m = np.max(s, axis=-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    w = np.exp2(s - m)                                        # -inf parts -> weight 0
    total = w.sum(axis=-1, keepdims=True)
    out = np.where(total > 0, (w[..., None] * v).sum(axis=-2) / np.where(total > 0, total, 1.0), 0.0)
    lse = np.where(total[..., 0] > 0, m[..., 0] + np.log2(np.where(total[..., 0] > 0, total[..., 0], 1.0)), -np.inf)
    out = np.where(bad[..., None], np.nan, out)
    lse = np.where(bad, np.nan, lse)
    return out.astype(np.float32), lse.astype(np.float32)
