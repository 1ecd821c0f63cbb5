"""Plain NumPy TensorScatter-24, written from the operator's pseudocode."""

from __future__ import annotations

import numpy as np

from .checks import check_tensor_scatter_inputs


def tensor_scatter_ref(past_cache, update, write_indices=None, axis=-2, mode="linear"):
    """ONNX TensorScatter-24: a copy of ``past_cache`` with ``update`` written along ``axis``.

    For each prefix index over the dims before ``axis`` (batch = prefix[0]) and each s in
    [0, seq_len): present[(*prefix, w[batch] + s)] = update[(*prefix, s)]; in circular mode the
    sequence coordinate (only that one) is taken modulo max_seq.
    """
    axis, w = check_tensor_scatter_inputs(past_cache, update, write_indices, axis, mode)
    present = past_cache.copy()
    max_seq, seq_len = past_cache.shape[axis], update.shape[axis]
    for prefix in np.ndindex(past_cache.shape[:axis]):
        for s in range(seq_len):
            pos = int(w[prefix[0]]) + s
            if mode == "circular":
                pos %= max_seq
            present[prefix + (pos,)] = update[prefix + (s,)]
    return present
