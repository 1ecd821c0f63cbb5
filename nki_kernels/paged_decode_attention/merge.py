"""Combine attention states computed over disjoint KV parts (base-2 log-sum-exp, as FlashInfer)."""

from __future__ import annotations

import numpy as np


def merge_state(v_a, s_a, v_b, s_b):
    """(v, s) of the union of two KV parts.

    v_*: [..., D] attention outputs; s_*: [...] base-2 LSE of each part.
    s = log2(2^s_a + 2^s_b); v = (v_a 2^s_a + v_b 2^s_b) / 2^s (a part with s = -inf weighs 0).
    """
    return merge_states(np.stack([v_a, v_b], axis=-2), np.stack([s_a, s_b], axis=-1))


def merge_states(v, s):
    """Merge n states: v [..., n, D], s [..., n] (base-2 LSE) -> (v [..., D], s [...]) in float32."""
    v = np.asarray(v, np.float64)
    s = np.asarray(s, np.float64)
    m = np.max(s, axis=-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    w = np.exp2(s - m)                                        # -inf parts -> weight 0
    total = w.sum(axis=-1, keepdims=True)
    out = np.where(total > 0, (w[..., None] * v).sum(axis=-2) / np.where(total > 0, total, 1.0), 0.0)
    lse = np.where(total[..., 0] > 0, m[..., 0] + np.log2(np.where(total[..., 0] > 0, total[..., 0], 1.0)), -np.inf)
    return out.astype(np.float32), lse.astype(np.float32)
