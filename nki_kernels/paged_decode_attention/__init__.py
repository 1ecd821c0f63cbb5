"""Batch decode attention over a paged KV cache (FlashInfer BatchDecodeWithPagedKVCache semantics)."""

from .decode import batch_decode
from .kernel import batch_decode_kernel
from .merge import merge_state, merge_states
from .plan import DecodeLayout, make_layout, request_table
from .reference import batch_decode_ref

__all__ = ["batch_decode", "batch_decode_ref", "batch_decode_kernel", "merge_state", "merge_states",
           "DecodeLayout", "make_layout", "request_table"]
