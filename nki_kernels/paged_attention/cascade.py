"""Multi-level cascade attention (FlashInfer ``MultiLevelCascadeAttentionWrapper``): one paged
cache viewed at several levels of a prefix tree. Level l groups the Q query tokens by
``qo_indptr_arr[l]`` (the queries under each node) and gives each group its pages
(``kv_indptr_arr[l]``, ``kv_indices_arr[l]``, ``kv_last_page_len_arr[l]``); a query attends the
concatenation of its groups' keys, level 0 first. A prefix shared by many requests is one group
at an upper level, so its pages are read once per step, not once per request.

Each level's attention state (output and base-2 LSE per query and head) comes from one
``batch_prefill`` launch (causal at the last level only: the shared levels lie wholly before a
query's own tokens), and the states are merged with ``merge_states``.
"""

from __future__ import annotations

import numpy as np

from nki_kernels.paged_cache.checks import require_int32_vector

from .api import batch_prefill
from .merge import merge_states
from .reference import attend, gather_kv, head_scale


def check_levels(q, qo_indptr_arr, kv_indptr_arr, kv_indices_arr, kv_last_page_len_arr):
    """The levels' tables agree: one of each per level, every level covering q's rows, and each
    level's query groups a union of the next level's (a node's queries are its children's)."""
    arrays = (qo_indptr_arr, kv_indptr_arr, kv_indices_arr, kv_last_page_len_arr)
    names = ("qo_indptr_arr", "kv_indptr_arr", "kv_indices_arr", "kv_last_page_len_arr")
    for name, arr in zip(names, arrays):
        if not isinstance(arr, (list, tuple)) or not arr:
            raise TypeError(f"{name} must be a non-empty list, one entry per level")
    levels = len(qo_indptr_arr)
    for name, arr in zip(names, arrays):
        if len(arr) != levels:
            raise ValueError(f"{name} has {len(arr)} levels but qo_indptr_arr has {levels}")
    for level, qo in enumerate(qo_indptr_arr):
        require_int32_vector(f"qo_indptr_arr[{level}]", qo)
        if qo.shape[0] < 1 or qo[0] != 0 or qo[-1] != q.shape[0] or (np.diff(qo) < 0).any():
            raise ValueError(f"qo_indptr_arr[{level}] must run from 0 to q's {q.shape[0]} rows, "
                             f"non-decreasing")
        if level + 1 < levels and not np.isin(qo, qo_indptr_arr[level + 1]).all():
            bad = int(qo[~np.isin(qo, qo_indptr_arr[level + 1])][0])
            raise ValueError(f"qo_indptr_arr[{level}] boundary {bad} is not a boundary of level "
                             f"{level + 1}: each group's queries must be whole groups of the "
                             f"next level")
    return levels


def cascade_attention(q, paged_kv_cache, qo_indptr_arr, kv_indptr_arr, kv_indices_arr,
                      kv_last_page_len_arr, kv_layout="NHD", causal=False, sm_scale=None,
                      logits_soft_cap=0.0, sinks=None, k_scale=1.0, v_scale=1.0,
                      return_lse=False, lnc=1):
    """Attention of q [Q, HQ, D] over its groups' keys at every level (lists, one entry per
    level, FlashInfer's argument names; the cache, layout and options as ``batch_prefill``;
    ``causal`` applies at the last level, where each query's own tokens are; sinks join the
    denominator once). Returns out [Q, HQ, D] (and lse [Q, HQ] float32, base 2), equal to
    attention of each query over the concatenation of its levels' keys. Sliding windows are not
    taken (a window's start depends on the concatenated position)."""
    levels = check_levels(q, qo_indptr_arr, kv_indptr_arr, kv_indices_arr, kv_last_page_len_arr)
    outs, lses = [], []
    for level in range(levels):
        last = level == levels - 1
        out, lse = batch_prefill(q, paged_kv_cache, qo_indptr_arr[level], kv_indptr_arr[level],
                                 kv_indices_arr[level], kv_last_page_len_arr[level], kv_layout,
                                 causal=bool(causal) and last, sm_scale=sm_scale,
                                 logits_soft_cap=logits_soft_cap,
                                 sinks=sinks if last else None, k_scale=k_scale,
                                 v_scale=v_scale, return_lse=True, lnc=lnc)
        outs.append(out)
        lses.append(lse)
    if levels == 1:
        out, lse = outs[0], lses[0]
    else:
        merged, lse = merge_states(np.stack(outs, axis=-2).astype(np.float32),
                                   np.stack(lses, axis=-1))
        out = merged.astype(q.dtype)
    return (out, lse) if return_lse else out


def cascade_attention_ref(q, paged_kv_cache, qo_indptr_arr, kv_indptr_arr, kv_indices_arr,
                          kv_last_page_len_arr, kv_layout="NHD", causal=False, sm_scale=None,
                          logits_soft_cap=0.0, sinks=None, k_scale=1.0, v_scale=1.0,
                          return_lse=False):
    """The float64 reference: each query token attends the keys of its group at every level,
    concatenated in level order, the last level's causally (query i of a group of q_len sees
    its keys below kv_len - q_len + i + 1), in one softmax."""
    from .checks import check_batch_prefill_inputs, soft_cap
    levels = check_levels(q, qo_indptr_arr, kv_indptr_arr, kv_indices_arr, kv_last_page_len_arr)
    probs = [check_batch_prefill_inputs(q, paged_kv_cache, qo_indptr_arr[lv], kv_indptr_arr[lv],
                                        kv_indices_arr[lv], kv_last_page_len_arr[lv], kv_layout,
                                        bool(causal) and lv == levels - 1, sm_scale,
                                        soft_cap(logits_soft_cap), -1, sinks, k_scale,
                                        v_scale)[0] for lv in range(levels)]
    Q, HQ, D = q.shape
    out, lse = np.zeros((Q, HQ, D)), np.full((Q, HQ), -np.inf)
    for t in range(Q):
        keys, values = [], []
        for lv in range(levels):
            qo = qo_indptr_arr[lv]
            b = int(np.searchsorted(qo, t, side="right") - 1)
            L = int(probs[lv].kv_lens[b])
            k_b, v_b = gather_kv(paged_kv_cache, kv_indptr_arr[lv], kv_indices_arr[lv], L, b,
                                 probs[lv].geo.page_size, kv_layout)
            if causal and lv == levels - 1:
                n, i = int(qo[b + 1] - qo[b]), t - int(qo[b])
                k_b, v_b = k_b[:L - n + i + 1], v_b[:L - n + i + 1]
            keys.append(k_b)
            values.append(v_b)
        keys, values = np.concatenate(keys), np.concatenate(values)
        group = probs[0].group
        for h in range(HQ):
            kvh = h // group
            out[t, h], lse[t, h] = attend(q[t, h], keys[:, kvh], values[:, kvh],
                                          probs[0].sm_scale * head_scale(k_scale, kvh),
                                          soft_cap(logits_soft_cap),
                                          None if sinks is None else sinks[h],
                                          head_scale(v_scale, kvh))
    out = out.astype(q.dtype)
    return (out, lse.astype(np.float32)) if return_lse else out
