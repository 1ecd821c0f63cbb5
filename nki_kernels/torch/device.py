"""The Neuron XLA path of the custom ops: tensors on a NeuronCore go straight to the NKI kernels.

``*_on_neuron`` need torch-neuronx (torch_xla) and the Neuron SDK's ``nki`` and raise a clear error
where they are absent. The work is in the ``*_device`` functions, written with torch ops only (no
NumPy on device data): small index arrays are copied to the host for validation and the plan (as
FlashInfer's ``plan()`` does), the prepared index arrays go back to the tensor's device, and the
NKI kernel is called on device tensors. On CPU tensors the same functions run the kernels in the
simulator, which is how they are tested here.
"""

from __future__ import annotations

import numpy as np
import torch

from .convert import to_numpy


def _require():
    try:
        import torch_xla  # noqa: F401
    except ImportError as err:
        raise RuntimeError("tensors on a Neuron device need torch-neuronx (torch_xla), which is not "
                           "installed; install the Neuron SDK on a trn/inf instance") from err
    from nki_kernels.backend import require_hardware
    require_hardware("the Neuron XLA path of nki_kernels.torch")


def _meta(t: torch.Tensor) -> np.ndarray:
    """A zero-stride NumPy stand-in with ``t``'s shape and dtype (metadata for host checks)."""
    dtype = to_numpy(torch.zeros((), dtype=t.dtype)).dtype
    return np.broadcast_to(np.zeros((), dtype), tuple(t.shape))


def _host(t):
    return None if t is None else to_numpy(t.detach().cpu())


def _cache_meta(kv_cache):
    """Host stand-ins of a fused cache tensor or a (k_cache, v_cache) pair of tensors."""
    if isinstance(kv_cache, (tuple, list)):
        return tuple(_meta(t) for t in kv_cache)
    return _meta(kv_cache)


def _cache_rows(kv_cache, row_elems):
    """The kernels' (k_rows, v_rows) views [R, row_elems] of the cache (v_rows None when fused:
    V follows K in each page)."""
    if isinstance(kv_cache, (tuple, list)):
        return tuple(t.view(-1, row_elems) for t in kv_cache)
    return kv_cache.view(-1, row_elems), None


def _dev(a, like):
    from nki_kernels.paged_attention.plan import torch_index
    return None if a is None else torch_index(np.ascontiguousarray(a), like.device)


def append_device(append_key, append_value, batch_indices, positions, kv_cache, kv_indices,
                  kv_indptr, kv_last_page_len, kv_layout, k_scale=None, v_scale=None):
    """append_paged_kv_cache on device tensors, through the NumPy entry's own checks, plan and
    launch (``paged_kv_append.checks.append_destinations``, ``plan.plan_append``,
    ``api.launch_append``)."""
    from nki_kernels.paged_kv_append.api import launch_append
    from nki_kernels.paged_kv_append.checks import append_destinations
    from nki_kernels.paged_kv_append.plan import plan_append
    idx = [_host(t) for t in (batch_indices, positions, kv_indices, kv_indptr, kv_last_page_len)]
    geo, quant, rows, keep = append_destinations(_meta(append_key), _meta(append_value), *idx[:2],
                                                 _cache_meta(kv_cache), *idx[2:], kv_layout,
                                                 k_scale, v_scale)
    k_rows, v_rows = _cache_rows(kv_cache, geo.row_elems)
    written = launch_append(plan_append(rows, keep, geo, quant), append_key, append_value,
                            k_rows, v_rows, geo, on_device=lambda a: _dev(a, k_rows))
    if written is None:
        return
    for got, rows in zip(written if v_rows is not None else (written,), (k_rows, v_rows)):
        _keep(got, rows)


def decode_device(q, kv_cache, kv_indptr, kv_indices, kv_last_page_len, kv_layout, sm_scale,
                  logits_soft_cap, window_left, sinks, k_scale=1.0, v_scale=1.0):
    """batch_decode on device tensors, through the NumPy entry's plan and launch."""
    from nki_kernels.paged_attention.api import run_decode
    from nki_kernels.paged_attention.plan import prepare_decode
    launch = prepare_decode(_meta(q), _cache_meta(kv_cache), _host(kv_indptr), _host(kv_indices),
                            _host(kv_last_page_len), kv_layout, sm_scale, logits_soft_cap,
                            window_left, _host(sinks), k_scale, v_scale)
    return run_decode(launch, q.contiguous(), _cache_rows(kv_cache, q.shape[2]),
                      on_device=lambda a: _dev(a, q))


def prefill_device(q, kv_cache, qo_indptr, kv_indptr, kv_indices, kv_last_page_len, kv_layout,
                   causal, sm_scale, logits_soft_cap, window_left, sinks, append_key,
                   append_value, k_scale=1.0, v_scale=1.0, custom_mask=None,
                   packed_custom_mask=None, mask_indptr=None):
    """batch_prefill on device tensors, through the NumPy entry's own plan and launches
    (``paged_attention.plan.prefill_parts``, ``api.run_prefill``): the host checks and plans
    (work items, row maps, the mixed-batch split), q is gathered into its padded blocks and the
    output scattered back with torch indexing on the device, and the kernel (with the fused
    write when append rows are given) runs there."""
    from nki_kernels.buckets import pad_rows
    from nki_kernels.paged_attention.api import run_prefill
    from nki_kernels.paged_attention.checks import check_batch_prefill_inputs
    from nki_kernels.paged_attention.custom_mask import request_masks
    from nki_kernels.paged_attention.fused_write import append_plan
    from nki_kernels.paged_attention.plan import prefill_parts
    from nki_kernels.paged_kv_append.plan import bucket_tokens
    cache = _cache_meta(kv_cache)
    table = (_host(qo_indptr), _host(kv_indptr), _host(kv_indices))
    last, sinks = _host(kv_last_page_len), _host(sinks)
    mask = (_host(custom_mask), _host(packed_custom_mask), _host(mask_indptr))
    causal = causal and mask[0] is None and mask[1] is None
    prob, q_lens = check_batch_prefill_inputs(_meta(q), cache, *table, last, kv_layout, causal,
                                              sm_scale, logits_soft_cap, window_left, sinks,
                                              k_scale, v_scale)
    masks = request_masks(*mask, q_lens, prob.kv_lens)
    parts = prefill_parts(prob, q_lens, table[0], cache, causal, logits_soft_cap, window_left,
                          sinks, k_scale, v_scale, 1, masks)
    writes = ()
    if append_key is not None or append_value is not None:
        slots, counts, quant, write = append_plan(
            None if append_key is None else _meta(append_key),
            None if append_value is None else _meta(append_value), cache, kv_layout,
            *table, last, prob.kv_lens, q.shape[0], k_scale, v_scale)
        Tb = bucket_tokens(q.shape[0])
        writes = (pad_rows(append_key, Tb), pad_rows(append_value, Tb),
                  _dev(slots, q), _dev(counts, q), None if quant is None else _dev(quant, q),
                  write)
    return run_prefill(parts, q, _cache_rows(kv_cache, q.shape[2]), writes,
                       on_device=lambda a: _dev(a, q))


def prefill_on_neuron(*args):
    _require()
    return prefill_device(*args)


def tensor_scatter_device(past_cache, update, write_indices, axis, mode):
    from nki_kernels.tensor_scatter.checks import check_tensor_scatter_inputs
    from nki_kernels.tensor_scatter.kernel import tensor_scatter_kernel
    axis, w = check_tensor_scatter_inputs(_meta(past_cache), _meta(update), _host(write_indices),
                                          axis, mode)
    present = past_cache.clone()
    M, S = past_cache.shape[axis], update.shape[axis]
    if update.numel() == 0:
        return present
    w32 = (w % M if mode == "circular" else w).astype(np.int32).reshape(-1, 1)
    words = _words(present, axis, M)
    _keep(tensor_scatter_kernel(words, _words(update.contiguous(), axis, S), _dev(w32, present),
                                past_cache.shape[0], mode == "circular"), words)
    return present


def _keep(written, target):
    """A mutating kernel returns what it wrote (an output aliasing ``target``, which keeps the
    call in a lazy XLA graph); copy it back only when the runtime handed back another buffer."""
    if written.data_ptr() != target.data_ptr():
        target.copy_(written)


def _words(t, axis, seq):
    """[O, seq, I] view of ``t`` as 1/2/4-byte integer words (bits unchanged)."""
    outer = int(np.prod(t.shape[:axis]))
    row_bytes = int(np.prod(t.shape[axis + 1:])) * t.element_size()
    word = next(w for w in (4, 2, 1) if row_bytes % w == 0)
    flat = t.reshape(-1).view(torch.uint8).view({4: torch.int32, 2: torch.int16, 1: torch.uint8}[word])
    return flat.view(outer, seq, row_bytes // word)


def append_on_neuron(*args):
    _require()
    return append_device(*args)


def decode_on_neuron(*args):
    _require()
    return decode_device(*args)


def tensor_scatter_on_neuron(*args):
    _require()
    return tensor_scatter_device(*args)
