"""The Neuron XLA path of the custom ops: tensors already on a NeuronCore go to the NKI kernels.

Needs torch-neuronx / torch_xla and the Neuron SDK's ``nki`` (installed from the Neuron pip
repository on a trn/inf instance). Each function raises a clear error where they are absent.
Index preparation that the CPU path does in NumPy is done with torch ops on the device here.
"""

from __future__ import annotations

import torch


def _require():
    try:
        import torch_xla  # noqa: F401
    except ImportError as err:
        raise RuntimeError("tensors on a Neuron device need torch-neuronx (torch_xla), which is not "
                           "installed; install the Neuron SDK on a trn/inf instance") from err
    from nki_kernels.backend import require_hardware
    require_hardware("the Neuron XLA path of nki_kernels.torch")


def append_on_neuron(append_key, append_value, batch_indices, positions, kv_cache, kv_indices,
                     kv_indptr, kv_last_page_len, kv_layout):
    _require()
    from nki_kernels.paged_kv_append.kernel import paged_kv_scatter_kernel
    layout_nhd = kv_layout == "NHD"
    n, _, a, b, d = kv_cache.shape
    page_size, heads = (a, b) if layout_nhd else (b, a)
    flat = kv_indptr[batch_indices.long()].long() * page_size + positions.long()
    pages = kv_indices[(flat // page_size)].long()
    per_kv = page_size * (1 if layout_nhd else heads)
    rows = (pages * 2 * per_kv + flat % page_size).to(torch.int32).reshape(-1, 1)
    row_elems = heads * d if layout_nhd else d
    k_rows = kv_cache.reshape(-1, row_elems)
    stride = 0 if layout_nhd else page_size * d
    paged_kv_scatter_kernel(k_rows, None, append_key, append_value, rows, 1 if layout_nhd else heads,
                            stride, page_size * heads * d)


def decode_on_neuron(*args):
    _require()
    raise NotImplementedError("batch_decode on a Neuron device: the host plan needs the page-table "
                              "lengths on the host; call nki_kernels.paged_decode_attention's kernel "
                              "with a plan built from CPU copies (not wired up yet)")


def tensor_scatter_on_neuron(*args):
    _require()
    raise NotImplementedError("tensor_scatter on a Neuron device is not wired up yet")
