"""Attention over a paged KV cache: batch decode (FlashInfer BatchDecodeWithPagedKVCache) and
ragged queries (BatchPrefillWithPagedKVCache: speculative verification, chunked prefill, mixed
batches, fused K/V write), one kernel.

Files: ``api`` (entries), ``kernel`` (+ ``kernel_*`` parts: the NKI kernel), ``reference``
(``*_ref``), ``checks`` (host rules), ``plan`` (launch plans), ``work`` (work items and tables),
``fused_write`` (the host half of the fused K/V write), ``custom_mask`` (FlashInfer's mask
layouts), ``head_scales``, ``merge``; FlashInfer's
other layouts over the same kernel: ``ragged`` (unpaged K/V), ``cascade`` (multi-level)."""

from .api import batch_decode, batch_prefill
from .cascade import cascade_attention, cascade_attention_ref
from .custom_mask import packbits, segment_packbits, tree_mask
from .kernel import batch_decode_kernel
from .merge import merge_state, merge_states
from .ragged import batch_prefill_ragged, batch_prefill_ragged_ref
from .reference import batch_decode_ref, batch_prefill_ref
from .work import request_table

__all__ = ["batch_decode", "batch_decode_ref", "batch_prefill", "batch_prefill_ref",
           "batch_prefill_ragged", "batch_prefill_ragged_ref", "cascade_attention",
           "cascade_attention_ref", "batch_decode_kernel", "merge_state", "merge_states",
           "request_table", "packbits", "segment_packbits", "tree_mask"]
