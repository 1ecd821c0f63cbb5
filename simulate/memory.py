"""Storage behind tensors and the per-instance SBUF/PSUM capacity accounting.

A tensor allocation is one ``Storage``: a flat NumPy array plus its buffer and allocation shape.
On-chip capacity is counted per partition: an SBUF allocation of shape ``(P, f...)`` holds
``prod(f) * itemsize`` bytes in each partition it may use, and live allocations must fit in the
target's usable SBUF (``tile_size.total_available_sbuf_size``). A PSUM allocation occupies whole
2 KiB banks; live ones must fit in the 8 banks. An allocation is live while any view of it is
referenced (CPython frees it when the last reference goes, e.g. a loop variable rebound).
"""

from __future__ import annotations

import weakref

import numpy as np

from . import dtypes
from .errors import CapacityError

ON_CHIP = ("sbuf", "psum")
HBM = ("private_hbm", "shared_hbm")


class Storage:
    """Flat memory of one allocation (or one wrapped host array)."""

    __slots__ = ("data", "shape", "buffer", "name", "address", "mm_written", "__weakref__")

    def __init__(self, data: np.ndarray, shape, buffer: str, name: str = "", address=None):
        self.data = data            # 1-D, contiguous, of the allocation dtype
        self.shape = tuple(int(n) for n in shape)
        self.buffer = buffer        # "sbuf" | "psum" | "private_hbm" | "shared_hbm"
        self.name = name
        self.address = address
        self.mm_written = None      # PSUM: bool per element, True where nc_matmul wrote last

    @property
    def dtype(self) -> np.dtype:
        return self.data.dtype

    @property
    def partition_bytes(self) -> int:
        return int(np.prod(self.shape[1:], dtype=np.int64)) * self.dtype.itemsize

    def elements(self, dtype) -> np.ndarray:
        """The same bytes as a flat array of ``dtype``."""
        dtype = np.dtype(dtype)
        return self.data if dtype == self.data.dtype else self.data.view(dtype)

    @classmethod
    def allocate(cls, shape, dtype, buffer: str, name: str = "", address=None) -> "Storage":
        dtype = np.dtype(dtype)
        size = int(np.prod(shape, dtype=np.int64))
        data = np.full(size, dtypes.sentinel(dtype), dtype=dtype)
        return cls(data, shape, buffer, name, address)


class Memory:
    """Live on-chip bytes per partition of one program instance, with the peaks reached."""

    def __init__(self, target):
        self.target = target
        self.sbuf_live = 0
        self.psum_banks_live = 0
        self.sbuf_peak = 0
        self.psum_banks_peak = 0

    def register(self, storage: Storage, fail) -> None:
        """Count ``storage`` until it is freed; ``fail(cls, message)`` raises when it does not fit."""
        if storage.buffer == "sbuf":
            nbytes = storage.partition_bytes
            if self.sbuf_live + nbytes > self.target.sbuf_usable_bytes:
                fail(CapacityError,
                     f"SBUF over capacity: allocating {storage.name or 'a tensor'} of shape "
                     f"{storage.shape} {storage.dtype.name} ({nbytes} B/partition) with "
                     f"{self.sbuf_live} B/partition live exceeds {self.target.sbuf_usable_bytes} "
                     f"B/partition usable on {self.target.name}")
            self.sbuf_live += nbytes
            self.sbuf_peak = max(self.sbuf_peak, self.sbuf_live)
            weakref.finalize(storage, self._release_sbuf, nbytes)
        elif storage.buffer == "psum":
            bank = self.target.psum_bank_bytes
            banks = -(-storage.partition_bytes // bank)
            if self.psum_banks_live + banks > self.target.psum_num_banks:
                fail(CapacityError,
                     f"PSUM over capacity: allocating {storage.name or 'a tensor'} of shape "
                     f"{storage.shape} {storage.dtype.name} ({banks} bank(s) of {bank} B) with "
                     f"{self.psum_banks_live} of {self.target.psum_num_banks} banks live")
            self.psum_banks_live += banks
            self.psum_banks_peak = max(self.psum_banks_peak, self.psum_banks_live)
            weakref.finalize(storage, self._release_psum, banks)

    def _release_sbuf(self, nbytes):
        self.sbuf_live -= nbytes

    def _release_psum(self, banks):
        self.psum_banks_live -= banks
