"""NKI kernels for LLM serving on Trainium: paged KV append, TensorScatter, paged attention.

Each kernel runs unchanged on trn hardware (real ``nki``) or on a CPU through ``simulate``.
``simulate/`` and ``access_patterns/`` install inside this package (``nki_kernels.simulate``,
``nki_kernels.access_patterns``; pyproject's package-dir), the editable install included.
"""

__version__ = "0.1.0"
