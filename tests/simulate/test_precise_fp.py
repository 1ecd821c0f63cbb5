"""``NKI_PRECISE_FP=0``: tensors a kernel allocates in a low-precision float type are float32, so
algorithmic error can be told apart from rounding (the official simulator's switch)."""

import ml_dtypes
import numpy as np
import pytest

from nki_kernels.simulate import jit, nisa, nl

BF16 = ml_dtypes.bfloat16


@jit
def _add_in_bf16(a, b):
    ta = nl.ndarray(a.shape, nl.bfloat16, buffer=nl.sbuf)
    tb = nl.ndarray(b.shape, nl.bfloat16, buffer=nl.sbuf)
    nisa.dma_copy(dst=ta, src=a)
    nisa.dma_copy(dst=tb, src=b)
    s = nl.ndarray(a.shape, nl.bfloat16, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=s, data1=ta, data2=tb, op=nl.add)
    out = nl.ndarray(a.shape, nl.bfloat16, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=s)
    return out


def _inputs():
    rng = np.random.default_rng(3)
    a = rng.standard_normal((16, 32)).astype(BF16)
    b = (rng.standard_normal((16, 32)) * 1e-3).astype(BF16)
    return a, b


@pytest.mark.parametrize("setting", [None, "1"])
def test_precise_mode_rounds_to_the_declared_dtype(monkeypatch, setting):
    if setting is None:
        monkeypatch.delenv("NKI_PRECISE_FP", raising=False)
    else:
        monkeypatch.setenv("NKI_PRECISE_FP", setting)
    a, b = _inputs()
    out = _add_in_bf16(a, b)
    assert out.dtype == BF16
    exact = a.astype(np.float32) + b.astype(np.float32)
    np.testing.assert_array_equal(out, exact.astype(BF16))
    assert not np.array_equal(out.astype(np.float32), exact)


@pytest.mark.parametrize("setting", ["0", "false"])
def test_imprecise_mode_keeps_float32(monkeypatch, setting):
    monkeypatch.setenv("NKI_PRECISE_FP", setting)
    a, b = _inputs()
    out = _add_in_bf16(a, b)
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, a.astype(np.float32) + b.astype(np.float32))


def test_imprecise_mode_separates_the_decode_kernels_rounding(monkeypatch):
    from nki_kernels.paged_attention import batch_decode, batch_decode_ref
    rng = np.random.default_rng(0)
    P, lens = 16, [37, 100, 5]
    pages = [-(-n // P) for n in lens]
    indptr = np.concatenate([[0], np.cumsum(pages)]).astype(np.int32)
    indices = rng.permutation(sum(pages) + 2)[:sum(pages)].astype(np.int32)
    last = np.array([(n - 1) % P + 1 for n in lens], np.int32)
    q = rng.standard_normal((3, 8, 64)).astype(BF16)
    cache = rng.standard_normal((sum(pages) + 2, 2, P, 2, 64)).astype(BF16)
    ref = batch_decode_ref(q.astype(np.float32), cache.astype(np.float32), indptr, indices, last)
    errors = {}
    for setting in ("1", "0"):
        monkeypatch.setenv("NKI_PRECISE_FP", setting)
        out = batch_decode(q, cache, indptr, indices, last)
        errors[setting] = np.abs(out.astype(np.float32) - ref).max()
    assert errors["0"] < 1e-5 < 1e-3 < errors["1"] < 2e-2
