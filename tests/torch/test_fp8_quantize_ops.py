"""fp8 quantize-on-write through the torch ops (simulator and reference backends, and the Neuron
device path on CPU tensors): the same cache bytes as the NumPy quantizing append, and attention
reading back with the same scales."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import nki_kernels.torch  # noqa: E402,F401  (registers the ops)
from nki_kernels.paged_kv_append import append_paged_kv_cache  # noqa: E402
from nki_kernels.torch import device, set_backend, get_backend  # noqa: E402
from nki_kernels.torch.convert import to_numpy, to_torch  # noqa: E402

N, P, H, D = 6, 4, 2, 16
KS, VS = 0.05, 0.02


def _case(rng):
    torch.manual_seed(int(rng.integers(1 << 31)))
    k = torch.randn(7, H, D, dtype=torch.bfloat16) * 3
    v = torch.randn(7, H, D, dtype=torch.bfloat16)
    batch = torch.tensor([0, 0, 0, 0, 0, 1, 1], dtype=torch.int32)
    pos = torch.tensor([0, 1, 2, 3, 4, 0, 1], dtype=torch.int32)
    indices = torch.tensor([4, 1, 3], dtype=torch.int32)
    indptr = torch.tensor([0, 2, 3], dtype=torch.int32)
    last = torch.tensor([1, 2], dtype=torch.int32)
    cache = torch.zeros(N, 2, P, H, D, dtype=torch.float8_e4m3fn)
    return k, v, batch, pos, cache, indices, indptr, last


def _numpy_bytes(args):
    k, v, batch, pos, cache, indices, indptr, last = (to_numpy(a).copy() for a in args)
    append_paged_kv_cache(k, v, batch, pos, cache, indices, indptr, last, k_scale=KS, v_scale=VS)
    return cache.tobytes()


@pytest.mark.parametrize("backend", ["sim", "ref"])
def test_append_op_quantizes(rng, target, backend):
    args = _case(rng)
    want = _numpy_bytes(args)
    before = get_backend()
    set_backend(backend)
    try:
        torch.ops.nki_kernels.append_paged_kv_cache(*args, "NHD", KS, VS)
    finally:
        set_backend(before)
    assert to_numpy(args[4]).tobytes() == want


def test_device_path_quantizes(rng, target):
    args = _case(rng)
    want = _numpy_bytes(args)
    device.append_device(*args, "NHD", KS, VS)
    assert to_numpy(args[4]).tobytes() == want


def test_prefill_op_fused_quantized_write_and_scaled_read(rng, target):
    k, v, batch, pos, cache, indices, indptr, last = _case(rng)
    want = _numpy_bytes((k, v, batch, pos, cache, indices, indptr, last))
    qo = torch.tensor([0, 5, 7], dtype=torch.int32)
    q = torch.randn(7, 4, D, dtype=torch.bfloat16)
    out, _ = torch.ops.nki_kernels.batch_prefill(q, cache, qo, indptr, indices, last, "NHD", True,
                                                 None, 0.0, -1, None, k, v, KS, VS)
    assert to_numpy(cache).tobytes() == want
    wide = to_numpy(cache).astype(np.float32) * np.array([KS, VS], np.float32)[None, :, None, None, None]
    ref, _ = torch.ops.nki_kernels.batch_prefill(q.float(), to_torch(wide), qo, indptr, indices,
                                                 last, "NHD", True)
    assert float((out.float() - ref).abs().max()) < 3e-2 * max(1.0, float(ref.abs().max()))
    dec, _ = torch.ops.nki_kernels.batch_decode(q[[4, 6]], cache, indptr, indices, last, "NHD",
                                                None, 0.0, -1, None, KS, VS)
    assert float((dec.float() - ref[[4, 6]]).abs().max()) < 3e-2 * max(1.0, float(ref.abs().max()))


KS_HEADS, VS_HEADS = (np.array([0.03, 0.08], np.float32), np.array([0.02, 0.01], np.float32))


def _numpy_bytes_per_head(args):
    k, v, batch, pos, cache, indices, indptr, last = (to_numpy(a).copy() for a in args)
    append_paged_kv_cache(k, v, batch, pos, cache, indices, indptr, last, k_scale=KS_HEADS,
                          v_scale=VS_HEADS)
    return cache.tobytes()


@pytest.mark.parametrize("backend", ["sim", "ref"])
def test_ops_take_scales_per_kv_head(rng, target, backend):
    """k_scales / v_scales [H]: the append quantizes each kv head with its own scale (the NumPy
    append's bytes) and attention reads back with them (= attention over the dequantized cache);
    a number and a tensor for the same scale are refused by name."""
    k, v, batch, pos, cache, indices, indptr, last = _case(rng)
    want = _numpy_bytes_per_head((k, v, batch, pos, cache, indices, indptr, last))
    ks, vs = torch.from_numpy(KS_HEADS), torch.from_numpy(VS_HEADS)
    before = get_backend()
    set_backend(backend)
    try:
        torch.ops.nki_kernels.append_paged_kv_cache(k, v, batch, pos, cache, indices, indptr, last,
                                                    "NHD", k_scales=ks, v_scales=vs)
        assert to_numpy(cache).tobytes() == want
        q = torch.randn(7, 4, D, dtype=torch.bfloat16)
        qo = torch.tensor([0, 5, 7], dtype=torch.int32)
        out, _ = torch.ops.nki_kernels.batch_prefill(q, cache, qo, indptr, indices, last, "NHD",
                                                     True, k_scales=ks, v_scales=vs)
        dec, _ = torch.ops.nki_kernels.batch_decode(q[[4, 6]], cache, indptr, indices, last,
                                                    "NHD", k_scales=ks, v_scales=vs)
        with pytest.raises(ValueError, match="k_scale=0.5 and k_scales"):
            torch.ops.nki_kernels.batch_decode(q[[4, 6]], cache, indptr, indices, last, "NHD",
                                               k_scale=0.5, k_scales=ks)
    finally:
        set_backend(before)
    scale = np.stack([KS_HEADS, VS_HEADS])[None, :, None, :, None]      # [1, 2, 1, H, 1]
    wide = to_torch(to_numpy(cache).astype(np.float32) * scale)
    ref, _ = torch.ops.nki_kernels.batch_prefill(q.float(), wide, qo, indptr, indices, last, "NHD",
                                                 True)
    tol = 3e-2 * max(1.0, float(ref.abs().max()))
    assert float((out.float() - ref).abs().max()) < tol
    assert float((dec.float() - ref[[4, 6]]).abs().max()) < tol
    # the reference backend must agree with itself per head too: a mixed-up head fails
    assert float((out.float() - ref.flip(1)).abs().max()) > tol


def test_device_path_folds_scales_per_kv_head(rng, target):
    """On a Neuron device the ops fold per-head scales in torch around the launch (q before,
    the output after): the device functions with the fold equal the NumPy entry point."""
    from nki_kernels.paged_attention import batch_decode
    from nki_kernels.torch.ops import _fold_on_device, _unfold
    k, v, batch, pos, cache, indices, indptr, last = _case(rng)
    device.append_device(k, v, batch, pos, cache, indices, indptr, last, "NHD", KS_HEADS, VS_HEADS)
    q = torch.randn(2, 4, D, dtype=torch.bfloat16)
    fq, k1, v1, post = _fold_on_device(q, cache, "NHD", KS_HEADS, VS_HEADS)
    assert (k1, v1) == (1.0, 1.0)
    out, _ = device.decode_device(fq, cache, indptr, indices, last, "NHD", None, 0.0, -1, None,
                                  k1, v1)
    want = batch_decode(to_numpy(q), to_numpy(cache), to_numpy(indptr), to_numpy(indices),
                        to_numpy(last), k_scale=KS_HEADS, v_scale=VS_HEADS)
    np.testing.assert_allclose(to_numpy(_unfold(out, post)).astype(np.float32),
                               want.astype(np.float32), atol=1e-2)
