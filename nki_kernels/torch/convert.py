"""Zero-copy views between CPU torch tensors and NumPy arrays (bf16/fp8 through their bits)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import torch

_BITS = {torch.bfloat16: (torch.int16, ml_dtypes.bfloat16),
         torch.float8_e4m3fn: (torch.uint8, ml_dtypes.float8_e4m3fn),
         torch.float8_e5m2: (torch.uint8, ml_dtypes.float8_e5m2)}
_BACK = {np.dtype(np_dtype): (bits, dtype) for dtype, (bits, np_dtype) in _BITS.items()}


def to_numpy(t: torch.Tensor) -> np.ndarray:
    """A NumPy array sharing ``t``'s memory (``t`` must be a CPU tensor)."""
    if t.device.type != "cpu":
        raise TypeError(f"expected a CPU tensor, got one on {t.device}")
    t = t.detach()
    if t.dtype in _BITS:
        bits, np_dtype = _BITS[t.dtype]
        return t.view(bits).numpy().view(np_dtype)
    return t.numpy()


def to_torch(a: np.ndarray) -> torch.Tensor:
    """A torch tensor sharing ``a``'s memory."""
    a = np.ascontiguousarray(a)
    if a.dtype in _BACK:
        bits, dtype = _BACK[a.dtype]
        return torch.from_numpy(a.view(np.int16 if bits == torch.int16 else np.uint8)).view(dtype)
    return torch.from_numpy(a)


def require_same_device(name: str, t, ref_name: str, ref_device) -> None:
    """The one device rule of every entry: tensor ``name`` must be on ``ref_device`` (where
    ``ref_name`` is); a RuntimeError, as torch raises for mixed devices."""
    if t.device != ref_device:
        raise RuntimeError(f"{name} is on {t.device} but {ref_name} is on {ref_device}; every "
                           f"tensor argument must be on the same device")
