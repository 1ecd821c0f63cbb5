"""The kernels as ``torch.library`` custom ops (namespace ``nki_kernels``).

    torch.ops.nki_kernels.append_paged_kv_cache(k, v, batch_indices, positions, kv_cache,
                                                 kv_indices, kv_indptr, kv_last_page_len, "NHD")
    out, lse = torch.ops.nki_kernels.batch_decode(q, kv_cache, kv_indptr, kv_indices,
                                                  kv_last_page_len, "NHD", sm_scale, soft_cap,
                                                  window_left)
    out, lse = torch.ops.nki_kernels.batch_prefill(q, kv_cache, qo_indptr, kv_indptr, kv_indices,
                                                   kv_last_page_len, "NHD", causal=True,
                                                   append_key=k, append_value=v)
    present = torch.ops.nki_kernels.tensor_scatter(past_cache, update, write_indices, axis, "linear")

CPU tensors run the kernels in the NKI simulator (``set_backend("ref")``: the NumPy references);
tensors on a Neuron XLA device go to the real NKI kernels (see ``device.py``). The fused 5-D
cache form is used here; the cache op declares that it mutates ``kv_cache``. Every op has a fake
implementation, so ``torch.compile`` traces through it.
"""

from __future__ import annotations

import os
from typing import Optional, Tuple

import numpy as np
import torch
from torch import Tensor

from .convert import require_same_device, to_numpy, to_torch

BACKEND_ENV = "NKI_KERNELS_TORCH_BACKEND"       # "sim" (default) | "ref"
_backend = [os.environ.get(BACKEND_ENV, "sim")]


def set_backend(name: str) -> None:
    """CPU execution of the ops: "sim" (kernels in the simulator) or "ref" (NumPy references)."""
    if name not in ("sim", "ref"):
        raise ValueError(f"backend={name!r} must be 'sim' or 'ref'")
    _backend[0] = name


def get_backend() -> str:
    return _backend[0]


def _on_neuron(t: Tensor) -> bool:
    return t.device.type in ("xla", "neuron", "privateuseone")


def _check_arguments(first: str, tensors: dict, written: tuple = ()) -> None:
    """Every tensor argument on the device of ``tensors[first]``, and no tensor written in place
    that autograd tracks (requires grad), checked before anything is written (in the op and in
    its fake, which is what runs when any argument is on the meta device)."""
    for name in written:
        if tensors[name].requires_grad:
            raise RuntimeError(f"{name} requires grad; the op writes it in place, which autograd "
                               f"cannot track (detach it, or use torch.no_grad())")
    ref = tensors[first].device
    for name, t in tensors.items():
        if t is not None:
            require_same_device(name, t, first, ref)


def _head_scales(name: str, scale, per_head: Optional[Tensor], default):
    """The scale an op passes on: ``scale`` (a number), or the per-kv-head tensor ``per_head``
    [H] as a float32 NumPy array (host data: the scales are folded or tabled on the host)."""
    if per_head is None:
        return scale
    if scale != default:
        raise ValueError(f"{name}={scale!r} and {name}s (per kv head) are both given; pass one")
    if per_head.dim() != 1 or not per_head.dtype.is_floating_point:
        raise ValueError(f"{name}s must be a 1-D float tensor [kv heads], got {per_head.dtype} "
                         f"{tuple(per_head.shape)}")
    return per_head.detach().to("cpu", torch.float32).numpy().copy()


def _fold_on_device(q, kv_cache, kv_layout, k_scale, v_scale):
    """Per-kv-head scales around a device launch, in torch (as head_scales.fold_head_scales):
    (q times k_scale per query head, v_scale per query head or None, the scales left: 1.0)."""
    from nki_kernels.paged_attention.head_scales import query_head_factors
    from nki_kernels.paged_cache.layout import geometry
    from .device import _meta
    H = geometry(_meta(kv_cache), kv_layout).num_heads
    factors = lambda name, scale: torch.from_numpy(           # noqa: E731
        query_head_factors(name, scale, H, q.shape[1] // H)).to(q.device)
    post = None
    if isinstance(k_scale, np.ndarray):
        q = (q.float() * factors("k_scale", k_scale)[None, :, None]).to(q.dtype)
        k_scale = 1.0
    if isinstance(v_scale, np.ndarray):
        post = factors("v_scale", v_scale)
        v_scale = 1.0
    return q, k_scale, v_scale, post


def _unfold(out, post):
    return out if post is None else (out.float() * post[None, :, None]).to(out.dtype)


@torch.library.custom_op("nki_kernels::append_paged_kv_cache", mutates_args=("kv_cache",))
def append_paged_kv_cache(append_key: Tensor, append_value: Tensor, batch_indices: Tensor,
                          positions: Tensor, kv_cache: Tensor, kv_indices: Tensor, kv_indptr: Tensor,
                          kv_last_page_len: Tensor, kv_layout: str = "NHD",
                          k_scale: Optional[float] = None, v_scale: Optional[float] = None,
                          k_scales: Optional[Tensor] = None,
                          v_scales: Optional[Tensor] = None) -> None:
    """With k_scale / v_scale, wider rows are quantized into an fp8 cache (per-tensor scales);
    k_scales / v_scales [H]: one scale per kv head instead."""
    _append_checks(append_key, append_value, batch_indices, positions, kv_cache, kv_indices,
                   kv_indptr, kv_last_page_len)
    k_scale = _head_scales("k_scale", k_scale, k_scales, None)
    v_scale = _head_scales("v_scale", v_scale, v_scales, None)
    if _on_neuron(kv_cache):
        from .device import append_on_neuron
        return append_on_neuron(append_key, append_value, batch_indices, positions, kv_cache,
                                kv_indices, kv_indptr, kv_last_page_len, kv_layout, k_scale,
                                v_scale)
    from nki_kernels.paged_kv_append import append_paged_kv_cache as run, append_paged_kv_cache_ref
    args = [to_numpy(t) for t in (append_key, append_value, batch_indices, positions, kv_cache,
                                  kv_indices, kv_indptr, kv_last_page_len)]
    if get_backend() == "ref":
        if k_scale is not None or v_scale is not None:
            from nki_kernels.paged_cache.quantize import quant_table, quantize_ref
            cache = args[4]
            quant_table(k_scale, v_scale, cache.dtype,                     # the same checks
                        {"append_key": args[0].dtype, "append_value": args[1].dtype},
                        args[0].shape[1] if args[0].ndim == 3 else 1, 1)
            args[0], args[1] = (quantize_ref(a, s, cache.dtype)
                                for a, s in ((args[0], k_scale), (args[1], v_scale)))
        to_numpy(kv_cache)[...] = append_paged_kv_cache_ref(*args, kv_layout)
    else:
        run(*args, kv_layout, k_scale=k_scale, v_scale=v_scale)   # writes kv_cache in place


def _append_checks(append_key, append_value, batch_indices, positions, kv_cache, kv_indices,
                   kv_indptr, kv_last_page_len):
    _check_arguments("kv_cache", dict(kv_cache=kv_cache, append_key=append_key,
                                      append_value=append_value, batch_indices=batch_indices,
                                      positions=positions, kv_indices=kv_indices,
                                      kv_indptr=kv_indptr, kv_last_page_len=kv_last_page_len),
                     written=("kv_cache",))


def _decode_checks(q, kv_cache, kv_indptr, kv_indices, kv_last_page_len, sinks):
    _check_arguments("q", dict(q=q, kv_cache=kv_cache, kv_indptr=kv_indptr, kv_indices=kv_indices,
                               kv_last_page_len=kv_last_page_len, sinks=sinks))


def _scatter_checks(past_cache, update, write_indices):
    _check_arguments("past_cache", dict(past_cache=past_cache, update=update,
                                        write_indices=write_indices))


@append_paged_kv_cache.register_fake
def _(append_key, append_value, batch_indices, positions, kv_cache, kv_indices, kv_indptr,
      kv_last_page_len, kv_layout="NHD", k_scale=None, v_scale=None, k_scales=None,
      v_scales=None):
    _append_checks(append_key, append_value, batch_indices, positions, kv_cache, kv_indices,
                   kv_indptr, kv_last_page_len)
    return None


@torch.library.custom_op("nki_kernels::batch_decode", mutates_args=())
def batch_decode(q: Tensor, kv_cache: Tensor, kv_indptr: Tensor, kv_indices: Tensor,
                 kv_last_page_len: Tensor, kv_layout: str = "NHD", sm_scale: Optional[float] = None,
                 logits_soft_cap: float = 0.0, window_left: int = -1,
                 sinks: Optional[Tensor] = None, k_scale: float = 1.0,
                 v_scale: float = 1.0, k_scales: Optional[Tensor] = None,
                 v_scales: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
    """k_scales / v_scales [H]: fp8 dequantization scales per kv head (instead of k_scale /
    v_scale)."""
    _decode_checks(q, kv_cache, kv_indptr, kv_indices, kv_last_page_len, sinks)
    k_scale = _head_scales("k_scale", k_scale, k_scales, 1.0)
    v_scale = _head_scales("v_scale", v_scale, v_scales, 1.0)
    if _on_neuron(q):
        from .device import decode_on_neuron
        q, k_scale, v_scale, post = _fold_on_device(q, kv_cache, kv_layout, k_scale, v_scale)
        out, lse = decode_on_neuron(q, kv_cache, kv_indptr, kv_indices, kv_last_page_len,
                                    kv_layout, sm_scale, logits_soft_cap, window_left, sinks,
                                    k_scale, v_scale)
        return _unfold(out, post), lse
    from nki_kernels.paged_attention import batch_decode as run, batch_decode_ref
    fn = batch_decode_ref if get_backend() == "ref" else run
    out, lse = fn(to_numpy(q), to_numpy(kv_cache), to_numpy(kv_indptr), to_numpy(kv_indices),
                  to_numpy(kv_last_page_len), kv_layout, sm_scale=sm_scale,
                  logits_soft_cap=logits_soft_cap, window_left=window_left,
                  sinks=None if sinks is None else to_numpy(sinks), k_scale=k_scale,
                  v_scale=v_scale, return_lse=True)
    return to_torch(out).clone(), torch.from_numpy(np.ascontiguousarray(lse, np.float32)).clone()


@batch_decode.register_fake
def _(q, kv_cache, kv_indptr, kv_indices, kv_last_page_len, kv_layout="NHD", sm_scale=None,
      logits_soft_cap=0.0, window_left=-1, sinks=None, k_scale=1.0, v_scale=1.0, k_scales=None,
      v_scales=None):
    _decode_checks(q, kv_cache, kv_indptr, kv_indices, kv_last_page_len, sinks)
    return torch.empty_like(q), q.new_empty(q.shape[:2], dtype=torch.float32)


@torch.library.custom_op("nki_kernels::batch_prefill", mutates_args=("kv_cache",))
def batch_prefill(q: Tensor, kv_cache: Tensor, qo_indptr: Tensor, kv_indptr: Tensor,
                  kv_indices: Tensor, kv_last_page_len: Tensor, kv_layout: str = "NHD",
                  causal: bool = True, sm_scale: Optional[float] = None,
                  logits_soft_cap: float = 0.0, window_left: int = -1,
                  sinks: Optional[Tensor] = None, append_key: Optional[Tensor] = None,
                  append_value: Optional[Tensor] = None, k_scale: float = 1.0,
                  v_scale: float = 1.0, k_scales: Optional[Tensor] = None,
                  v_scales: Optional[Tensor] = None, custom_mask: Optional[Tensor] = None,
                  packed_custom_mask: Optional[Tensor] = None,
                  mask_indptr: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
    """Ragged queries (q [Q, HQ, D], request b's rows qo_indptr[b]..) over the paged cache; with
    append_key/append_value [Q, H, D] the step's K/V are written into ``kv_cache`` first by the
    same launch (the only case in which the op mutates it; wider rows into an fp8 cache are
    quantized with k_scale / v_scale, which attention reads back with; k_scales / v_scales [H]:
    per kv head instead). custom_mask (bool) / packed_custom_mask (uint8) / mask_indptr: a
    custom mask in FlashInfer's layout (``paged_attention.batch_prefill``; tree attention of
    speculative decoding: ``paged_attention.tree_mask``). Returns out [Q, HQ, D], lse [Q, HQ]."""
    _prefill_checks(q, kv_cache, qo_indptr, kv_indptr, kv_indices, kv_last_page_len, sinks,
                    append_key, append_value)
    k_scale = _head_scales("k_scale", k_scale, k_scales, 1.0)
    v_scale = _head_scales("v_scale", v_scale, v_scales, 1.0)
    if _on_neuron(q):
        from .device import prefill_on_neuron
        if append_key is not None or append_value is not None:
            if isinstance(k_scale, np.ndarray) or isinstance(v_scale, np.ndarray):
                raise NotImplementedError("per-kv-head scales with the fused write on a Neuron "
                                          "device: append with append_paged_kv_cache first")
        q, k_scale, v_scale, post = _fold_on_device(q, kv_cache, kv_layout, k_scale, v_scale)
        out, lse = prefill_on_neuron(q, kv_cache, qo_indptr, kv_indptr, kv_indices,
                                     kv_last_page_len, kv_layout, causal, sm_scale,
                                     logits_soft_cap, window_left, sinks, append_key,
                                     append_value, k_scale, v_scale, custom_mask,
                                     packed_custom_mask, mask_indptr)
        return _unfold(out, post), lse
    from nki_kernels.paged_attention import batch_prefill as run, batch_prefill_ref
    np_ = lambda t: None if t is None else to_numpy(t)      # noqa: E731
    args = [np_(t) for t in (q, kv_cache, qo_indptr, kv_indptr, kv_indices, kv_last_page_len)]
    options = dict(causal=causal, sm_scale=sm_scale, logits_soft_cap=logits_soft_cap,
                   window_left=window_left, sinks=np_(sinks), k_scale=k_scale,
                   v_scale=v_scale, return_lse=True, custom_mask=np_(custom_mask),
                   packed_custom_mask=np_(packed_custom_mask), mask_indptr=np_(mask_indptr))
    if get_backend() == "ref":
        if append_key is not None:                  # the reference of the write: the append's
            _append_rows(append_key, append_value, kv_cache, qo_indptr, kv_indptr, kv_indices,
                         kv_last_page_len, kv_layout, k_scale, v_scale)
        out, lse = batch_prefill_ref(*args, kv_layout, **options)
    else:
        out, lse = run(*args, kv_layout, append_key=np_(append_key),
                       append_value=np_(append_value), **options)
    return to_torch(out).clone(), torch.from_numpy(np.ascontiguousarray(lse, np.float32)).clone()


def _append_rows(append_key, append_value, kv_cache, qo_indptr, kv_indptr, kv_indices,
                 kv_last_page_len, kv_layout, k_scale, v_scale):
    from nki_kernels.paged_kv_append import append_paged_kv_cache_ref, get_batch_indices_positions
    from nki_kernels.paged_cache.checks import check_page_table
    from nki_kernels.paged_cache.layout import geometry
    cache, indices, indptr, last = (to_numpy(t) for t in (kv_cache, kv_indices, kv_indptr,
                                                          kv_last_page_len))
    kv_lens = check_page_table(indices, indptr, last, geometry(cache, kv_layout))
    batch, pos = get_batch_indices_positions(to_numpy(qo_indptr), kv_lens.astype(np.int32),
                                             append_key.shape[0])
    key, value = to_numpy(append_key), to_numpy(append_value)
    if key.dtype != cache.dtype:                    # quantize on write (fp8 cache)
        from nki_kernels.paged_cache.quantize import quantize_ref
        key, value = quantize_ref(key, k_scale, cache.dtype), quantize_ref(value, v_scale, cache.dtype)
    cache[...] = append_paged_kv_cache_ref(key, value, batch, pos, cache, indices, indptr, last,
                                           kv_layout)


def _prefill_checks(q, kv_cache, qo_indptr, kv_indptr, kv_indices, kv_last_page_len, sinks,
                    append_key, append_value):
    _check_arguments("q", dict(q=q, kv_cache=kv_cache, qo_indptr=qo_indptr, kv_indptr=kv_indptr,
                               kv_indices=kv_indices, kv_last_page_len=kv_last_page_len,
                               sinks=sinks, append_key=append_key, append_value=append_value),
                     written=("kv_cache",) if append_key is not None else ())


@batch_prefill.register_fake
def _(q, kv_cache, qo_indptr, kv_indptr, kv_indices, kv_last_page_len, kv_layout="NHD",
      causal=True, sm_scale=None, logits_soft_cap=0.0, window_left=-1, sinks=None,
      append_key=None, append_value=None, k_scale=1.0, v_scale=1.0, k_scales=None,
      v_scales=None, custom_mask=None, packed_custom_mask=None, mask_indptr=None):
    _prefill_checks(q, kv_cache, qo_indptr, kv_indptr, kv_indices, kv_last_page_len, sinks,
                    append_key, append_value)
    return torch.empty_like(q), q.new_empty(q.shape[:2], dtype=torch.float32)


@torch.library.custom_op("nki_kernels::tensor_scatter", mutates_args=())
def tensor_scatter(past_cache: Tensor, update: Tensor, write_indices: Optional[Tensor] = None,
                   axis: int = -2, mode: str = "linear") -> Tensor:
    _scatter_checks(past_cache, update, write_indices)
    if _on_neuron(past_cache):
        from .device import tensor_scatter_on_neuron
        return tensor_scatter_on_neuron(past_cache, update, write_indices, axis, mode)
    from nki_kernels.tensor_scatter import tensor_scatter as run, tensor_scatter_ref
    fn = tensor_scatter_ref if get_backend() == "ref" else run
    w = None if write_indices is None else to_numpy(write_indices)
    return to_torch(fn(to_numpy(past_cache), to_numpy(update), w, axis, mode)).clone()


@tensor_scatter.register_fake
def _(past_cache, update, write_indices=None, axis=-2, mode="linear"):
    _scatter_checks(past_cache, update, write_indices)
    return torch.empty_like(past_cache)
