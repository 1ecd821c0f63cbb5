"""Kernel-side dtype facts without NumPy attributes: NKI Beta 2 dtypes are not NumPy dtypes (the
real package's are strings), so kernels compare against the ``nl`` constants instead of reading
a NumPy item-size attribute."""

from __future__ import annotations

from nki_kernels.backend import nl

_SIZES = (
    (1, ("bool_", "int8", "uint8", "float8_e4m3", "float8_e4m3fn", "float8_e5m2",
         "float8_e8m0fnu")),
    (2, ("int16", "uint16", "float16", "bfloat16")),
    (4, ("int32", "uint32", "float32", "tfloat32")),
)


def dtype_bytes(dtype) -> int:
    """Bytes of one element of ``dtype`` (an ``nl`` dtype); an assertion names any other."""
    size = 0
    for entry in _SIZES:
        for name in entry[1]:
            if dtype == getattr(nl, name):
                size = entry[0]
    assert size, f"dtype {dtype} is not an NKI element type of known size"
    return size
