"""The block-table entry points (``nki_kernels.block_tables``) for torch tensors, as
vLLM-neuron's and NxD Inference's paths hold them: ``block_tables [B, max_blocks]`` int32 padded
with -1, ``seq_lens [B]``, ``query_start_loc [B+1]``, a ``kv_cache (2, N, Hkv, P, D)`` (HND) /
``(2, N, P, Hkv, D)`` (NHD) tensor or a (k_cache, v_cache) pair of 4-D tensors.

CPU tensors run the kernels in the simulator on zero-copy NumPy views: the cache tensors are
written in place, nothing is written when an argument is refused. The tables are host metadata
(they become the kernels' small device tables). On a Neuron device, the torch ops take the
fused ``[N, 2, ...]`` cache with CSR tables (``block_tables_to_csr`` converts); these entries
refuse device tensors by name rather than copying the cache to the host.
"""

from __future__ import annotations

import numpy as np
import torch

from nki_kernels import block_tables as _np
from .convert import to_numpy, to_torch


def _host(name, t):
    """A torch tensor (or number / None) as the NumPy value the block-table entries take."""
    if not isinstance(t, torch.Tensor):
        return t
    if t.device.type != "cpu":
        raise NotImplementedError(
            f"{name} is on {t.device}: the torch block-table entries run on CPU tensors (the "
            f"simulator); on a Neuron device convert with nki_kernels.block_tables."
            f"block_tables_to_csr and call torch.ops.nki_kernels.* with a fused cache")
    return to_numpy(t)


def _cache(kv_cache):
    """The cache as the NumPy entries take it (views: writes reach the tensors), refusing a
    tensor autograd tracks (the append writes it in place)."""
    parts = tuple(kv_cache) if isinstance(kv_cache, (tuple, list)) else (kv_cache,)
    for i, t in enumerate(parts):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"kv_cache must be a tensor or a (k_cache, v_cache) pair of tensors, "
                            f"got {type(t).__name__}")
        if t.requires_grad:
            raise RuntimeError(f"kv_cache{'' if len(parts) == 1 else f'[{i}]'} requires grad; the "
                               f"entries write it in place (detach it, or use torch.no_grad())")
        if not t.is_contiguous():
            raise ValueError(f"kv_cache{'' if len(parts) == 1 else f'[{i}]'} must be contiguous "
                             f"(its pages are addressed by their strides)")
    views = tuple(_host("kv_cache", t) for t in parts)
    return views if isinstance(kv_cache, (tuple, list)) else views[0]


def _options(options):
    return {k: _host(k, v) for k, v in options.items()}


def append_kv_with_block_tables(key, value, kv_cache, block_tables, seq_lens, query_start_loc,
                                kv_layout="HND", **options):
    """``nki_kernels.block_tables.append_kv_with_block_tables`` on torch tensors: key, value
    [T, Hkv, D]; options: spare_page, lnc, k_scale / v_scale (numbers or [Hkv] tensors: fp8
    quantize on write). Writes ``kv_cache`` in place."""
    cache = _cache(kv_cache)
    _np.append_kv_with_block_tables(_host("key", key), _host("value", value), cache,
                                    _host("block_tables", block_tables),
                                    _host("seq_lens", seq_lens),
                                    _host("query_start_loc", query_start_loc), kv_layout,
                                    **_options(options))


def attention_with_block_tables(q, kv_cache, block_tables, seq_lens, query_start_loc=None,
                                kv_layout="HND", causal=True, **options):
    """``nki_kernels.block_tables.attention_with_block_tables`` on torch tensors: returns out
    (q's dtype) and with return_lse=True also lse (float32, base 2), as tensors; options as
    there (tensors for sinks, per-head scales, append_key / append_value)."""
    out = _np.attention_with_block_tables(_host("q", q), _cache(kv_cache),
                                          _host("block_tables", block_tables),
                                          _host("seq_lens", seq_lens),
                                          _host("query_start_loc", query_start_loc), kv_layout,
                                          causal, **_options(options))
    if isinstance(out, tuple):
        return tuple(to_torch(np.ascontiguousarray(a)) for a in out)
    return to_torch(np.ascontiguousarray(out))
