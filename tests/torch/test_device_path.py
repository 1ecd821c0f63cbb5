"""The Neuron-device path of the ops, run on CPU tensors: the torch-side preparation feeds the same
NKI kernels (executed here by the simulator, which accepts torch tensors)."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from nki_kernels.torch import device  # noqa: E402

from ..kernels.paged_attention.conftest import make_decode_case  # noqa: E402
from ..kernels.paged_kv_append.conftest import make_append_case  # noqa: E402


def t(a):
    return torch.from_numpy(a) if isinstance(a, np.ndarray) else a


def test_append_device_path(rng, target):
    from nki_kernels.paged_kv_append import append_paged_kv_cache_ref
    for layout in ("NHD", "HND"):
        args = make_append_case(rng, [20, 5], [6, 5], 4, 2, 8, layout=layout)
        want = append_paged_kv_cache_ref(*args)
        targs = [t(a) for a in args]
        device.append_device(*targs)
        np.testing.assert_array_equal(targs[4].numpy().view(np.uint32), want.view(np.uint32))


def test_decode_device_path(rng, target):
    from nki_kernels.paged_attention import batch_decode_ref
    args = make_decode_case(rng, [33, 0, 5], 8, 2, 2, 16, layout="HND")
    out, lse = device.decode_device(*(t(a) for a in args), None, 0.0, -1, None)
    ref, ref_lse = batch_decode_ref(*args, return_lse=True)
    assert isinstance(out, torch.Tensor)
    np.testing.assert_allclose(out.numpy(), ref, atol=2e-5)
    np.testing.assert_allclose(lse.numpy(), ref_lse, atol=2e-4)


@pytest.mark.parametrize("fused_write", [False, True])
def test_prefill_device_path(rng, target, fused_write):
    """Ragged queries with the padded-block gather and the scatter back done by torch indexing;
    with the fused write, the cache ends as the separate append leaves it."""
    from nki_kernels.paged_attention import batch_prefill_ref
    from nki_kernels.paged_kv_append import append_paged_kv_cache_ref, get_batch_indices_positions

    from ..kernels.paged_attention.test_prefill import make_prefill_case
    q, cache, qo, ptr, idx, last, layout = make_prefill_case(rng, [3, 1, 9], [3, 20, 40], 8, 2,
                                                             2, 16)
    key = rng.standard_normal((13, 2, 16)).astype(np.float32)
    value = rng.standard_normal((13, 2, 16)).astype(np.float32)
    want_cache = cache
    if fused_write:
        batch, pos = get_batch_indices_positions(qo, np.array([3, 20, 40], np.int32), 13)
        want_cache = append_paged_kv_cache_ref(key, value, batch, pos, cache, idx, ptr, last)
    cache_t = t(cache.copy())
    out, lse = device.prefill_device(t(q), cache_t, t(qo), t(ptr), t(idx), t(last), layout, True,
                                     None, 0.0, -1, None, t(key) if fused_write else None,
                                     t(value) if fused_write else None)
    ref, ref_lse = batch_prefill_ref(q, want_cache, qo, ptr, idx, last, layout, causal=True,
                                     return_lse=True)
    np.testing.assert_allclose(out.numpy(), ref, atol=2e-5)
    np.testing.assert_allclose(lse.numpy(), ref_lse, atol=2e-4)
    np.testing.assert_array_equal(cache_t.numpy(), want_cache)


def test_prefill_device_path_with_a_packed_mask(rng, target):
    """A custom mask (bit-packed, FlashInfer's layout) through the device path: its table is
    one more of the plan's arrays moved next to q."""
    from nki_kernels.paged_attention import batch_prefill_ref, segment_packbits

    from ..kernels.paged_attention.test_prefill import make_prefill_case
    q_lens, kv_lens = [3, 1, 9], [3, 20, 40]
    q, cache, qo, ptr, idx, last, layout = make_prefill_case(rng, q_lens, kv_lens, 8, 2, 2, 16)
    bits = rng.random(int(np.dot(q_lens, kv_lens))) < 0.5
    packed, mask_ptr = segment_packbits(bits, np.concatenate([[0], np.cumsum(
        np.multiply(q_lens, kv_lens))]), bitorder="little")
    out, lse = device.prefill_device(t(q), t(cache), t(qo), t(ptr), t(idx), t(last), layout, True,
                                     None, 0.0, -1, None, None, None,
                                     packed_custom_mask=t(packed), mask_indptr=t(mask_ptr))
    ref, ref_lse = batch_prefill_ref(q, cache, qo, ptr, idx, last, layout, custom_mask=bits,
                                     return_lse=True)
    np.testing.assert_allclose(out.numpy(), ref, atol=2e-5)
    np.testing.assert_allclose(lse.numpy(), ref_lse, atol=2e-4)


def test_tensor_scatter_device_path(rng, target):
    from nki_kernels.tensor_scatter import tensor_scatter_ref
    cache = torch.randn(3, 2, 9, 4, dtype=torch.bfloat16)
    update = torch.randn(3, 2, 4, 4, dtype=torch.bfloat16)
    w = torch.tensor([0, 7, 20])
    got = device.tensor_scatter_device(cache, update, w, 2, "circular")
    want = tensor_scatter_ref(cache.view(torch.int16).numpy(), update.view(torch.int16).numpy(),
                              w.numpy(), 2, "circular")
    np.testing.assert_array_equal(got.view(torch.int16).numpy(), want)
    assert not torch.equal(got, cache)                       # functional: input untouched


def test_mutating_kernels_return_the_tensor_they_wrote(rng, target, monkeypatch):
    """An aliased output: the simulator hands back the caller's own tensor, so the device path
    copies nothing; a runtime returning another buffer gets copied back."""
    from nki_kernels.paged_kv_append import api as append_api
    from nki_kernels.paged_kv_append import append_paged_kv_cache_ref
    args = make_append_case(rng, [9, 3], [4, 2], 4, 2, 8)
    want = append_paged_kv_cache_ref(*args)
    seen = []
    real = append_api.paged_kv_scatter_kernel

    def spy(rows, *rest):
        out = real(rows, *rest)
        seen.append(out is rows)
        return out
    monkeypatch.setattr(append_api, "paged_kv_scatter_kernel", spy)
    targs = [t(a) for a in args]
    device.append_device(*targs)
    assert seen == [True]
    np.testing.assert_array_equal(targs[4].numpy().view(np.uint32), want.view(np.uint32))

    other = torch.arange(6.0)
    target_tensor = torch.zeros(6)
    device._keep(other, target_tensor)                       # another buffer: copied back
    assert torch.equal(target_tensor, other)


@pytest.mark.sim_only
def test_prefill_device_path_runs_the_numpy_entrys_launches(rng, target):
    """One host path: a mixed batch (single queries beside longer ones) runs the same two
    launches on the device path as in the NumPy entry, and gives the same bytes."""
    from nki_kernels import simulate
    from nki_kernels.paged_attention import batch_prefill

    from ..kernels.paged_attention.test_prefill import make_prefill_case
    q, cache, qo, ptr, idx, last, layout = make_prefill_case(rng, [3, 1, 9], [3, 20, 40], 8, 2,
                                                             2, 16)
    key = rng.standard_normal((13, 2, 16)).astype(np.float32)
    numpy_cache, torch_cache = cache.copy(), t(cache.copy())
    with simulate.tracing() as numpy_launches:
        want, want_lse = batch_prefill(q, numpy_cache, qo, ptr, idx, last, layout, causal=True,
                                       append_key=key, append_value=-key, return_lse=True)
    with simulate.tracing() as device_launches:
        out, lse = device.prefill_device(t(q), torch_cache, t(qo), t(ptr), t(idx), t(last),
                                         layout, True, None, 0.0, -1, None, t(key), t(-key))
    assert len(numpy_launches) == len(device_launches) == 2
    assert [len(a) for a in numpy_launches] == [len(b) for b in device_launches]
    np.testing.assert_array_equal(out.numpy(), want)
    np.testing.assert_array_equal(lse.numpy(), want_lse)
    np.testing.assert_array_equal(torch_cache.numpy(), numpy_cache)
