"""dtype_bytes (kernel-side element size, no NumPy attributes) agrees with the storage sizes."""

import numpy as np
import pytest

from nki_kernels.kernel_dtypes import dtype_bytes
from nki_kernels.simulate import nl

NAMES = ["bool_", "int8", "uint8", "float8_e4m3", "float8_e4m3fn", "float8_e5m2", "float8_e8m0fnu",
         "int16", "uint16", "float16", "bfloat16", "int32", "uint32", "float32"]


@pytest.mark.parametrize("name", NAMES)
def test_dtype_bytes_matches_storage(name):
    assert dtype_bytes(getattr(nl, name)) == np.dtype(getattr(nl, name)).itemsize


def test_unknown_dtype_is_refused():
    """Kernel code: an assertion (NKI has no raise), naming the dtype."""
    with pytest.raises(AssertionError, match="float8_e4m3fn_x4 is not an NKI element type"):
        dtype_bytes(nl.float8_e4m3fn_x4)
