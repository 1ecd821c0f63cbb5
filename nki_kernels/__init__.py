"""NKI kernels for LLM serving on Trainium: paged KV append, TensorScatter, paged decode attention.

Each kernel runs unchanged on trn hardware (real ``nki``) or on a CPU through ``simulate``.
"""

__version__ = "0.1.0"
