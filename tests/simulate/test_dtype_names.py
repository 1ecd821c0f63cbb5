"""NKI Beta 2 dtypes are names: kernel code sees ``nl`` dtype strings, not NumPy dtypes."""

import ml_dtypes
import numpy as np
import pytest

from nki_kernels.simulate import jit, nisa, nl


def test_nl_dtypes_are_names_that_compare_with_numpy():
    assert nl.float32 == "float32" and isinstance(nl.bfloat16, str)
    assert isinstance(nl.bfloat16, nl.dtype) and nl.bool == nl.bool_ == "bool"
    assert nl.bfloat16 == np.dtype(ml_dtypes.bfloat16) and nl.float16 != nl.bfloat16
    assert np.zeros(2, nl.bfloat16).dtype == ml_dtypes.bfloat16         # host-side NumPy use
    with pytest.raises(AttributeError, match="NKI Beta 2 dtypes are names"):
        nl.float32.itemsize


@jit
def _reads_itemsize(x):
    out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
    per_row = x.shape[1] * x.dtype.itemsize
    return out, per_row


@jit
def _compares_names(x):
    t = nl.ndarray(x.shape, x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    wide = nl.ndarray(x.shape, nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=wide, src=t)
    out = nl.ndarray(x.shape, nl.float32, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=wide)
    return out, x.dtype == nl.bfloat16, str(t.dtype), wide.dtype == np.float32


def test_kernel_code_reading_numpy_attributes_fails_as_on_the_compiler():
    with pytest.raises(AttributeError, match="'itemsize'.*compare with the nl constants"):
        _reads_itemsize(np.zeros((2, 3), np.float32))


def test_kernel_code_comparing_dtype_names_runs():
    x = np.arange(6, dtype=np.float32).reshape(2, 3).astype(ml_dtypes.bfloat16)
    out, is_bf16, name, wide_is_f32 = _compares_names(x)
    np.testing.assert_array_equal(out, x.astype(np.float32))
    assert is_bf16 and name == "bfloat16"
    assert not wide_is_f32          # "float32" == np.float32 is False here as on the compiler
