"""ONNX TensorScatter-24 (KV-cache update along any axis but 0, linear or circular).

    tensor_scatter_(past_cache, update, write_indices=None, axis=-2, mode="linear")   # in place
    present = tensor_scatter(past_cache, update, write_indices, axis, mode)          # ONNX-style
    present = tensor_scatter_ref(...)                                               # NumPy reference

Element types: every fixed-width NumPy/ml_dtypes type (bool, int8..int64, uint8..uint64,
float16/32/64, bfloat16, float8 variants, int4/uint4/float4 as ml_dtypes' one-per-byte arrays,
complex64/128): the kernel moves bits, viewing elements as 1/2/4-byte words. Not supported:
strings (variable width) and ONNX's packed 4-bit layout (two values per byte).
"""

from __future__ import annotations

import numpy as np

from .checks import check_tensor_scatter_inputs
from .kernel import tensor_scatter_kernel


def _as_words(array: np.ndarray, axis: int, seq: int):
    """[O, seq, I] view of ``array`` in the widest unsigned word (<= 4 bytes) dividing a row."""
    outer = int(np.prod(array.shape[:axis], dtype=np.int64))
    row_bytes = int(np.prod(array.shape[axis + 1:], dtype=np.int64)) * array.dtype.itemsize
    word = next(w for w in (4, 2, 1) if row_bytes % w == 0)
    flat = array.reshape(-1).view(np.uint8).view(np.dtype(f"u{word}"))
    return flat.reshape(outer, seq, row_bytes // word)


def tensor_scatter_(past_cache, update, write_indices=None, axis=-2, mode="linear"):
    """Write ``update`` into ``past_cache`` in place (ONNX TensorScatter-24 semantics).

    Args:
        past_cache: (B, D1, ..., max_seq, ..., Dn), C-contiguous, written in place.
        update: same shape but seq_len (<= max_seq) on ``axis``; same dtype.
        write_indices: (B,) int64 or None (zeros); circular mode takes them modulo max_seq.
        axis: the sequence axis, never 0 (negative counts from the end); mode: "linear" | "circular".
    Raises ValueError/TypeError before anything is written. An ``update`` that views
    ``past_cache`` is read whole before the first write (the result of the original values).
    """
    axis, w = check_tensor_scatter_inputs(past_cache, update, write_indices, axis, mode)
    if not past_cache.flags.c_contiguous or not past_cache.flags.writeable:
        raise ValueError("past_cache must be a writeable C-contiguous array for an in-place update")
    max_seq, seq_len = past_cache.shape[axis], update.shape[axis]
    if update.size == 0:
        return
    w32 = (w % max_seq if mode == "circular" else w).astype(np.int32).reshape(-1, 1)
    if np.may_share_memory(update, past_cache):      # read every input before the first write
        update = update.copy()
    cache_words = _as_words(past_cache, axis, max_seq)
    update_words = _as_words(np.ascontiguousarray(update), axis, seq_len)
    tensor_scatter_kernel(cache_words, update_words, w32, past_cache.shape[0], mode == "circular")


def tensor_scatter(past_cache, update, write_indices=None, axis=-2, mode="linear"):
    """Functional form (as in ONNX): a new array ``present_cache``; ``past_cache`` is unchanged."""
    check_tensor_scatter_inputs(past_cache, update, write_indices, axis, mode)
    present = np.ascontiguousarray(past_cache).copy()
    tensor_scatter_(present, update, write_indices, axis, mode)
    return present
