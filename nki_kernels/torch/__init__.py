"""torch integration: custom ops (``torch.ops.nki_kernels.*``) over the NKI kernels."""

from .ops import append_paged_kv_cache, batch_decode, get_backend, set_backend, tensor_scatter

__all__ = ["append_paged_kv_cache", "batch_decode", "tensor_scatter", "set_backend", "get_backend"]
