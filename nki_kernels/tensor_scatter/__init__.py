"""ONNX TensorScatter-24 on a dense KV cache, in place (``tensor_scatter_``) or functional
(``tensor_scatter``).

Files: ``api`` (entries), ``kernel`` (the NKI kernel), ``reference`` (``tensor_scatter_ref``),
``checks`` (host rules)."""

from .api import tensor_scatter, tensor_scatter_
from .kernel import tensor_scatter_kernel
from .reference import tensor_scatter_ref

__all__ = ["tensor_scatter", "tensor_scatter_", "tensor_scatter_ref", "tensor_scatter_kernel"]
