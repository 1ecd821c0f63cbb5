"""``get_batch_indices_positions``: ragged append layout -> (request, position) per token."""

from __future__ import annotations

import numpy as np


def get_batch_indices_positions(append_indptr, seq_lens, nnz):
    """Request index and sequence position of each appended token (FlashInfer semantics).

    Request b appends tokens append_indptr[b]..append_indptr[b+1]; they are the last tokens of its
    sequence of length seq_lens[b], so token j of them sits at seq_lens[b] - append_len_b + j.
    Returns int32 [nnz] arrays; rows past append_indptr[-1] keep batch -1 and position 0.

    Example: append_indptr=[0,1,3,6,10], seq_lens=[5,5,5,5], nnz=10 ->
        batch [0,1,1,2,2,2,3,3,3,3], positions [4,3,4,2,3,4,1,2,3,4]
    """
    append_indptr = np.asarray(append_indptr)
    seq_lens = np.asarray(seq_lens)
    if append_indptr.ndim != 1 or seq_lens.shape != (append_indptr.shape[0] - 1,):
        raise ValueError(f"append_indptr [B+1] and seq_lens [B] disagree: {append_indptr.shape}, {seq_lens.shape}")
    lens = np.diff(append_indptr.astype(np.int64))
    if (lens < 0).any() or append_indptr[0] != 0:
        raise ValueError("append_indptr must start at 0 and be non-decreasing")
    if (lens > seq_lens).any():
        b = int(np.flatnonzero(lens > seq_lens)[0])
        raise ValueError(f"request {b} appends {lens[b]} tokens but seq_lens[{b}]={seq_lens[b]}")
    if append_indptr[-1] > nnz:
        raise ValueError(f"append_indptr[-1]={append_indptr[-1]} exceeds nnz={nnz}")
    batch = np.full(nnz, -1, np.int32)
    positions = np.zeros(nnz, np.int32)
    total = int(append_indptr[-1])
    owner = np.repeat(np.arange(lens.size), lens)
    batch[:total] = owner
    j = np.arange(total) - append_indptr[owner]
    positions[:total] = seq_lens[owner] - lens[owner] + j
    return batch, positions
