"""The paged KV cache itself, shared by the append and attention kernels: its layouts and
geometry (``layout``), the page-table rules (``checks``), each appended token's request and
position (``batch_indices``), fp8 quantization on write (``quantize``) and the serving stacks'
block tables beside FlashInfer's CSR page table (``block_tables``)."""

from .batch_indices import get_batch_indices_positions
from .block_tables import block_tables_to_csr, csr_to_block_tables
from .checks import check_page_table
from .layout import CacheGeometry, geometry, split_cache

__all__ = ["CacheGeometry", "geometry", "split_cache", "check_page_table",
           "get_batch_indices_positions", "block_tables_to_csr", "csr_to_block_tables"]
