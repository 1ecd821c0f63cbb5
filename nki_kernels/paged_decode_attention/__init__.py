"""Attention over a paged KV cache: batch decode (FlashInfer BatchDecodeWithPagedKVCache) and
ragged queries (BatchPrefillWithPagedKVCache: speculative verification, chunked prefill, mixed
batches), one kernel."""

from .decode import batch_decode
from .kernel import batch_decode_kernel
from .merge import merge_state, merge_states
from .plan import DecodeLayout, make_layout, request_table
from .prefill import batch_prefill
from .prefill_reference import batch_prefill_ref
from .reference import batch_decode_ref

__all__ = ["batch_decode", "batch_decode_ref", "batch_prefill", "batch_prefill_ref",
           "batch_decode_kernel", "merge_state", "merge_states",
           "DecodeLayout", "make_layout", "request_table"]
