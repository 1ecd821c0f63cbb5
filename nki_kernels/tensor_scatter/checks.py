"""Input rules of ONNX TensorScatter-24, checked on the host before anything is written."""

from __future__ import annotations

import numpy as np

MODES = ("linear", "circular")


def check_dtype(dtype) -> None:
    """Any fixed-width element type moves bit-exactly; variable-width (string/object) cannot."""
    dtype = np.dtype(dtype)
    if dtype.kind in "OUS" or dtype.hasobject or dtype.itemsize == 0:
        raise TypeError(f"past_cache dtype {dtype} is not supported: TensorScatter here moves "
                        f"fixed-width elements (strings/objects are not)")


def normalize_axis(axis, rank: int) -> int:
    if not isinstance(axis, (int, np.integer)) or isinstance(axis, bool):
        raise TypeError(f"axis={axis!r} must be an integer")
    if not -rank <= axis < rank:
        raise ValueError(f"axis={axis} is out of range for past_cache of rank {rank}")
    axis = int(axis) % rank
    if axis == 0:
        raise ValueError("axis must not be 0: dimension 0 is the batch dimension")
    return axis


def check_tensor_scatter_inputs(past_cache, update, write_indices, axis, mode):
    """Validate shapes, dtypes and values.

    Returns:
        (axis in [1, rank), write_indices as an int64 array of shape (batch,)).
    """
    for name, arr in (("past_cache", past_cache), ("update", update)):
        if not isinstance(arr, np.ndarray):
            raise TypeError(f"{name} must be a numpy array, got {type(arr).__name__}")
    if mode not in MODES:
        raise ValueError(f"mode={mode!r} must be 'linear' or 'circular'")
    if past_cache.ndim < 2:
        raise ValueError(f"past_cache must have rank >= 2 (batch + sequence), got shape {past_cache.shape}")
    if update.ndim != past_cache.ndim:
        raise ValueError(f"update rank {update.ndim} != past_cache rank {past_cache.ndim}")
    axis = normalize_axis(axis, past_cache.ndim)
    if update.dtype != past_cache.dtype:
        raise TypeError(f"update dtype {update.dtype} != past_cache dtype {past_cache.dtype}")
    check_dtype(past_cache.dtype)
    for d, (u, c) in enumerate(zip(update.shape, past_cache.shape)):
        if d != axis and u != c:
            raise ValueError(f"update shape {update.shape} differs from past_cache shape "
                             f"{past_cache.shape} in dimension {d} (only axis={axis} may differ)")
    max_seq, seq_len = past_cache.shape[axis], update.shape[axis]
    if seq_len > max_seq:
        raise ValueError(f"update sequence length {seq_len} exceeds max_sequence_length {max_seq}")
    batch = past_cache.shape[0]
    if write_indices is None:
        return axis, np.zeros(batch, np.int64)
    if not isinstance(write_indices, np.ndarray):
        raise TypeError(f"write_indices must be a numpy int64 array, got {type(write_indices).__name__}")
    if write_indices.dtype != np.int64:
        raise TypeError(f"write_indices dtype {write_indices.dtype} must be int64 (ONNX tensor(int64))")
    if write_indices.shape != (batch,):
        raise ValueError(f"write_indices shape {write_indices.shape} must be (batch,) = ({batch},)")
    if (write_indices < 0).any():
        b = int(np.flatnonzero(write_indices < 0)[0])
        raise ValueError(f"write_indices[{b}]={int(write_indices[b])} is negative; write indices must be >= 0")
    if mode == "linear":
        over = write_indices + seq_len > max_seq
        if over.any():
            b = int(np.flatnonzero(over)[0])
            raise ValueError(f"linear mode needs write_indices + sequence_length <= max_sequence_length: "
                             f"write_indices[{b}]={int(write_indices[b])} + {seq_len} > {max_seq}")
    return axis, write_indices
