"""The block-table entry points (``nki_kernels.block_tables``) for torch tensors, as
vLLM-neuron's and NxD Inference's paths hold them: ``block_tables [B, max_blocks]`` int32 padded
with -1, ``seq_lens [B]``, ``query_start_loc [B+1]``, a ``kv_cache (2, N, Hkv, P, D)`` (HND) /
``(2, N, P, Hkv, D)`` (NHD) tensor or a (k_cache, v_cache) pair of 4-D tensors.

CPU tensors run the kernels in the simulator on zero-copy NumPy views: the cache tensors are
written in place, nothing is written when an argument is refused. On a Neuron device the small
tables are copied to the host, checked and turned into the CSR page table there (as the
stacks' own ``plan`` steps do), moved back, and the NKI kernels run on the device tensors
(``append_kv_device`` / ``attention_device``, which the tests run on CPU tensors through the
simulator); the cache never leaves the device.
"""

from __future__ import annotations

import numpy as np
import torch

from nki_kernels import block_tables as _np
from nki_kernels.paged_cache.layout import geometry
from .convert import require_same_device, to_numpy, to_torch


def _host(name, t):
    """A CPU torch tensor (or number / None) as the NumPy value the block-table entries take."""
    if not isinstance(t, torch.Tensor):
        return t
    require_same_device(name, t, "the cache", torch.device("cpu"))
    return to_numpy(t)


def _cache_parts(kv_cache):
    return tuple(kv_cache) if isinstance(kv_cache, (tuple, list)) else (kv_cache,)


def _on_device(kv_cache) -> bool:
    """The cache lives on a Neuron device (the device path), not on the CPU (the simulator)."""
    return any(isinstance(t, torch.Tensor) and t.device.type != "cpu"
               for t in _cache_parts(kv_cache))


def _on_host(t):
    """Tables held anywhere (a tensor on any device, or NumPy) as NumPy on the host: they are
    small; this is the validation and the plan, as the stacks' own ``plan`` steps do."""
    return to_numpy(t.detach().cpu()) if isinstance(t, torch.Tensor) else t


def _geometry(pair, kv_layout):
    from .device import _cache_meta
    return geometry(_cache_meta(pair), kv_layout)


def _device_cache(kv_cache):
    """The device path's cache: a fused tensor is ``(2, N, ...)`` here, so its K and V halves
    (contiguous) go as a pair."""
    parts = _checked_parts(kv_cache)
    if len(parts) == 1:
        if parts[0].dim() != 5 or parts[0].shape[0] != 2:
            raise ValueError(f"kv_cache shape {tuple(parts[0].shape)} must be (2, N, H, P, D) "
                             f"(HND) / (2, N, P, H, D) (NHD), or pass a (k_cache, v_cache) pair")
        return parts[0][0], parts[0][1]
    return parts


def _numbers_only(**scales):
    for name, value in scales.items():
        if isinstance(value, torch.Tensor):
            raise NotImplementedError(f"{name} per kv head on a Neuron device: pass a number here, "
                                      f"or use torch.ops.nki_kernels.* with k_scales= / v_scales=")


def _device_options(options, allowed):
    """The options the device path takes; anything else is refused by name, never ignored."""
    unknown = sorted(k for k, v in options.items()
                     if k not in allowed and not (k == "lnc" and v == 1)
                     and not (k == "spare_page" and v is None))
    if unknown:
        raise NotImplementedError(f"{', '.join(unknown)}: not taken by the block-table entries on "
                                  f"a Neuron device (the torch ops take lnc and spare_page)")
    return {k: v for k, v in options.items() if k in allowed}


def append_kv_device(key, value, kv_cache, block_tables, seq_lens, query_start_loc,
                     kv_layout="HND", k_scale=None, v_scale=None):
    """The device path of ``append_kv_with_block_tables`` (torch operations and the NKI kernel
    only; the small tables go through the host)."""
    from .device import _dev, append_device
    _numbers_only(k_scale=k_scale, v_scale=v_scale)
    pair = _device_cache(kv_cache)
    (indptr, indices, last), batch, positions = _np.append_tables(
        *(_on_host(t) for t in (block_tables, seq_lens, query_start_loc)),
        _geometry(pair, kv_layout), key.shape[0])
    with _np.caller_names():
        append_device(key, value, *(_dev(a, pair[0]) for a in (batch, positions)), pair,
                      *(_dev(a, pair[0]) for a in (indices, indptr, last)), kv_layout, k_scale,
                      v_scale)


def attention_device(q, kv_cache, block_tables, seq_lens, query_start_loc=None,
                     kv_layout="HND", causal=True, sm_scale=None, logits_soft_cap=0.0,
                     window_left=-1, sinks=None, append_key=None, append_value=None,
                     return_lse=False, k_scale=1.0, v_scale=1.0):
    """The device path of ``attention_with_block_tables`` (decode without query_start_loc,
    ragged queries with it; fp8 scales as numbers)."""
    from . import device
    _numbers_only(k_scale=k_scale, v_scale=v_scale)
    pair = _device_cache(kv_cache)
    geo = _geometry(pair, kv_layout)
    seq_lens = _on_host(seq_lens)
    indptr, indices, last = (device._dev(a, q) for a in _np.block_tables_to_csr(
        _on_host(block_tables), seq_lens, geo.page_size, geo.num_pages))
    with _np.caller_names():
        if query_start_loc is None:
            out, lse = device.decode_device(q, pair, indptr, indices, last, kv_layout, sm_scale,
                                            logits_soft_cap, window_left, sinks, k_scale, v_scale)
        else:
            _np.check_query_start_loc(_on_host(query_start_loc), seq_lens)
            out, lse = device.prefill_device(q, pair, query_start_loc, indptr, indices, last,
                                             kv_layout, causal, sm_scale, logits_soft_cap,
                                             window_left, sinks, append_key, append_value,
                                             k_scale, v_scale)
    return (out, lse) if return_lse else out


def _checked_parts(kv_cache):
    """The cache's tensors, refusing a non-tensor, a tensor autograd tracks (the append writes
    it in place) and a strided one (pages are addressed by their strides)."""
    parts = _cache_parts(kv_cache)
    for i, t in enumerate(parts):
        name = "kv_cache" if len(parts) == 1 else f"kv_cache[{i}]"
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"kv_cache must be a tensor or a (k_cache, v_cache) pair of tensors, "
                            f"got {type(t).__name__}")
        if t.requires_grad:
            raise RuntimeError(f"{name} requires grad; the entries write it in place (detach "
                               f"it, or use torch.no_grad())")
        if not t.is_contiguous():
            raise ValueError(f"{name} must be contiguous (its pages are addressed by their "
                             f"strides)")
    return parts


def _cache(kv_cache):
    """The cache as the NumPy entries take it (views: writes reach the tensors)."""
    parts = _checked_parts(kv_cache)
    views = tuple(_host("kv_cache", t) for t in parts)
    return views if isinstance(kv_cache, (tuple, list)) else views[0]


def _options(options):
    return {k: _host(k, v) for k, v in options.items()}


def append_kv_with_block_tables(key, value, kv_cache, block_tables, seq_lens, query_start_loc,
                                kv_layout="HND", **options):
    """``nki_kernels.block_tables.append_kv_with_block_tables`` on torch tensors: key, value
    [T, Hkv, D]; options: spare_page, lnc, k_scale / v_scale (numbers or [Hkv] tensors: fp8
    quantize on write). Writes ``kv_cache`` in place."""
    if _on_device(kv_cache):
        from .device import _require
        _require()
        return append_kv_device(key, value, kv_cache, block_tables, seq_lens, query_start_loc,
                                kv_layout, **_device_options(options, ("k_scale", "v_scale")))
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
    if _on_device(kv_cache):
        from .device import _require
        _require()
        return attention_device(q, kv_cache, block_tables, seq_lens, query_start_loc, kv_layout,
                                causal, **_device_options(options, (
                                    "sm_scale", "logits_soft_cap", "window_left", "sinks",
                                    "append_key", "append_value", "return_lse", "k_scale",
                                    "v_scale")))
    out = _np.attention_with_block_tables(_host("q", q), _cache(kv_cache),
                                          _host("block_tables", block_tables),
                                          _host("seq_lens", seq_lens),
                                          _host("query_start_loc", query_start_loc), kv_layout,
                                          causal, **_options(options))
    if isinstance(out, tuple):
        return tuple(to_torch(np.ascontiguousarray(a)) for a in out)
    return to_torch(np.ascontiguousarray(out))
