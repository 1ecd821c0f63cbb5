"""Paged KV-cache append (FlashInfer ``append_paged_kv_cache``), the vLLM ``slot_mapping`` entry,
and host-side page-table tools."""

from .append import append_paged_kv_cache, reshape_and_cache
from .batch_indices import get_batch_indices_positions
from .kernel import paged_kv_scatter_kernel
from .layout import CacheGeometry, geometry, split_cache
from .page_table import OutOfPages, PagedKVCache
from .reference import append_paged_kv_cache_ref, reshape_and_cache_ref

__all__ = [
    "append_paged_kv_cache", "append_paged_kv_cache_ref", "reshape_and_cache",
    "reshape_and_cache_ref",
    "get_batch_indices_positions", "PagedKVCache", "OutOfPages", "paged_kv_scatter_kernel",
    "CacheGeometry", "geometry", "split_cache",
]
