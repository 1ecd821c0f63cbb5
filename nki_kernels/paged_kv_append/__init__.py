"""Paged KV-cache append (FlashInfer ``append_paged_kv_cache``), the vLLM ``slot_mapping`` entry,
and the page allocator ``PagedKVCache``.

Files: ``api`` (entries), ``kernel`` (the NKI scatter), ``reference`` (``*_ref``), ``checks``
(the rows' rules), ``plan`` (slots padded to buckets), ``page_table`` (the allocator); the cache's
layout, table rules and quantization are ``nki_kernels.paged_cache``'s."""

from nki_kernels.paged_cache.batch_indices import get_batch_indices_positions
from nki_kernels.paged_cache.layout import CacheGeometry, geometry, split_cache

from .api import append_paged_kv_cache, reshape_and_cache
from .kernel import paged_kv_scatter_kernel
from .page_table import OutOfPages, PagedKVCache
from .reference import append_paged_kv_cache_ref, reshape_and_cache_ref

__all__ = [
    "append_paged_kv_cache", "append_paged_kv_cache_ref", "reshape_and_cache",
    "reshape_and_cache_ref",
    "get_batch_indices_positions", "PagedKVCache", "OutOfPages", "paged_kv_scatter_kernel",
    "CacheGeometry", "geometry", "split_cache",
]
