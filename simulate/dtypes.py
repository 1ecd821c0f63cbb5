"""NKI data types as NumPy dtypes (bf16/fp8 from ml_dtypes), casts and uninitialised-memory sentinels.

NKI has no 64-bit types: float64/int64/uint64/complex arrays are refused at kernel launch.
``tfloat32`` is stored as float32.

``NKI_PRECISE_FP=0`` (the official simulator's switch; default 1) allocates the tensors a kernel
creates with a low-precision float dtype (bfloat16, float16, the fp8 types) as float32 instead,
so a kernel's algorithmic error can be told apart from its rounding error. Host arrays passed in
keep their dtype (a DMA into a float32 tile widens them exactly).
"""

from __future__ import annotations

import os

import ml_dtypes
import numpy as np

bool_ = np.dtype(np.bool_)
int8, int16, int32 = np.dtype(np.int8), np.dtype(np.int16), np.dtype(np.int32)
uint8, uint16, uint32 = np.dtype(np.uint8), np.dtype(np.uint16), np.dtype(np.uint32)
float16, float32 = np.dtype(np.float16), np.dtype(np.float32)
bfloat16 = np.dtype(ml_dtypes.bfloat16)
tfloat32 = np.dtype(np.float32)
float8_e4m3 = np.dtype(ml_dtypes.float8_e4m3)
float8_e4m3fn = np.dtype(ml_dtypes.float8_e4m3fn)
float8_e5m2 = np.dtype(ml_dtypes.float8_e5m2)
float8_e8m0fnu = np.dtype(ml_dtypes.float8_e8m0fnu)
# MX packed types (NeuronCore-v4 nc_matmul_mx / quantize_mx): four fp8 codes in 4 bytes, four fp4
# codes in 2 bytes. Stored as one structured element of raw bytes; distinct field names keep the
# types apart. Element i of a packed x4 element holds code i (fp4: two codes per byte, low first).
float8_e4m3fn_x4 = np.dtype([("float8_e4m3fn_x4", np.uint8, (4,))])
float8_e5m2_x4 = np.dtype([("float8_e5m2_x4", np.uint8, (4,))])
float4_e2m1fn_x4 = np.dtype([("float4_e2m1fn_x4", np.uint8, (2,))])
PACKED_X4 = {float8_e4m3fn_x4: ml_dtypes.float8_e4m3fn, float8_e5m2_x4: ml_dtypes.float8_e5m2,
             float4_e2m1fn_x4: ml_dtypes.float4_e2m1fn}

NKI_DTYPES = {
    "bool_": bool_, "int8": int8, "int16": int16, "int32": int32, "uint8": uint8,
    "uint16": uint16, "uint32": uint32, "float16": float16, "float32": float32,
    "bfloat16": bfloat16, "tfloat32": tfloat32, "float8_e4m3": float8_e4m3,
    "float8_e4m3fn": float8_e4m3fn, "float8_e5m2": float8_e5m2, "float8_e8m0fnu": float8_e8m0fnu,
    "float8_e4m3fn_x4": float8_e4m3fn_x4, "float8_e5m2_x4": float8_e5m2_x4,
    "float4_e2m1fn_x4": float4_e2m1fn_x4,
}
_SUPPORTED = set(NKI_DTYPES.values())
# the float types NKI_PRECISE_FP=0 widens to float32
LOW_PRECISION = frozenset((bfloat16, float16, float8_e4m3, float8_e4m3fn, float8_e5m2))


PRECISE_FP_ENV = "NKI_PRECISE_FP"


def precise_fp() -> bool:
    """False when ``NKI_PRECISE_FP`` is 0 / false / off (read once per launch)."""
    return os.environ.get(PRECISE_FP_ENV, "1").strip().lower() not in ("0", "false", "off", "no")


def widened(dtype) -> np.dtype:
    """The dtype an allocation of ``dtype`` gets under ``NKI_PRECISE_FP=0``: float32 for the
    low-precision floats, else ``dtype``."""
    return float32 if dtype in LOW_PRECISION else dtype


def as_dtype(dtype) -> np.dtype:
    """A NumPy dtype from a dtype, a NumPy type or an NKI name ("bfloat16", "float8_e4m3", ...)."""
    if isinstance(dtype, str) and dtype in NKI_DTYPES:
        return NKI_DTYPES[dtype]
    return np.dtype(dtype)


class DType(str):
    """An NKI dtype as kernels see it: its name (the real package's dtypes are strings, e.g.
    ``nl.bfloat16``), so it compares equal to the other ``nl`` constants, to the name and to the
    NumPy dtype. NumPy attributes (``itemsize``, ``kind``, ``name``, ...) do not exist on the
    device side: reading one is an error naming the rule, as it would fail on the compiler."""

    __slots__ = ()

    def __getattr__(self, attr):
        raise AttributeError(
            f"nl dtype {str(self)!r} has no attribute {attr!r}: NKI Beta 2 dtypes are names, not "
            f"NumPy dtypes; compare with the nl constants (dtype == nl.bfloat16) instead")


_NAMES = {}


def nki_name(dtype) -> DType:
    """The kernel-side dtype (a ``DType`` name) of a NumPy dtype."""
    return _NAMES[as_dtype(dtype)]


def is_nki_dtype(dtype) -> bool:
    return as_dtype(dtype) in _SUPPORTED


def is_packed(dtype) -> bool:
    """An MX packed x4 type (moved bit for bit; unpacked by the MX instructions only)."""
    return as_dtype(dtype) in PACKED_X4


def is_float(dtype) -> bool:
    dtype = as_dtype(dtype)
    return dtype.kind == "f" or dtype in (bfloat16, float8_e4m3, float8_e4m3fn, float8_e5m2,
                                          float8_e8m0fnu)


def is_int(dtype) -> bool:
    return as_dtype(dtype).kind in "iu"


def sentinel(dtype):
    """Fill value of fresh memory: NaN for floats, the most negative (signed) or largest
    (unsigned) integer, True for bool: values a kernel never produces by accident."""
    dtype = as_dtype(dtype)
    if is_packed(dtype):                # every code NaN (fp8: 0x7f); fp4 has no NaN: all ones
        return np.array(tuple([np.full(dtype[0].shape, 0x7F if dtype != float4_e2m1fn_x4 else 0xFF,
                                       np.uint8)]), dtype=dtype)
    if is_float(dtype):
        return np.array(np.nan, dtype=np.float32).astype(dtype)
    if dtype == bool_:
        return True
    info = np.iinfo(dtype)
    return info.min if dtype.kind == "i" else info.max


def cast(values: np.ndarray, dtype) -> np.ndarray:
    """Convert as the engines do: through fp32; to integers round half to even and saturate."""
    dtype = as_dtype(dtype)
    values = np.asarray(values)
    if values.dtype == dtype:
        return values
    if is_int(dtype):
        if is_int(values.dtype):
            info = np.iinfo(dtype)
            return np.clip(values.astype(np.int64), info.min, info.max).astype(dtype)
        wide = np.rint(values.astype(np.float64))
        info = np.iinfo(dtype)
        wide = np.nan_to_num(wide, nan=0.0, posinf=info.max, neginf=info.min)
        return np.clip(wide, info.min, info.max).astype(dtype)
    if dtype == bool_:
        return values.astype(np.float32) != 0
    if is_int(values.dtype) and dtype != float32:
        return values.astype(np.float32).astype(dtype)
    return values.astype(np.float32).astype(dtype) if values.dtype != float32 else values.astype(dtype)


for _name, _dt in NKI_DTYPES.items():              # float32 over tfloat32, "bool" for bool_
    if _NAMES.get(_dt) is None:
        _NAMES[_dt] = DType("bool" if _name == "bool_" else _name)
