"""Storage behind tensors and the per-instance SBUF/PSUM capacity accounting.

A tensor allocation is one ``Storage``: a flat NumPy array plus its buffer and allocation shape.
On-chip capacity is counted per partition: an SBUF allocation of shape ``(P, f...)`` holds
``prod(f) * itemsize`` bytes in each partition it may use, and live allocations must fit in the
target's usable SBUF (``tile_size.total_available_sbuf_size``). A PSUM allocation occupies whole
2 KiB banks; live ones must fit in the 8 banks. An allocation is live while any view of it is
referenced (CPython frees it when the last reference goes, e.g. a loop variable rebound).

A tensor placed with ``address=(partition_offset, free_offset_bytes)`` occupies that region
instead of an allocator-chosen one. Tensors placed at the same address with the same extent
share storage (a write through one is read through the other, as on the device), and the region
is counted once however many tensors are placed there, so rotating a few fixed PSUM banks is
not a capacity error. Tensors placed so that they partly overlap share those bytes too, as on the
device: each such region keeps its own array, and before any access to one it takes in the
shared bytes from the overlapping regions accessed since (newest last), so a write through one
is read through the others. Allocators that reuse addresses for differently shaped tiles
(nki-library's SbufManager, attention kernels rotating PSUM banks) rely on this.
"""

from __future__ import annotations

import itertools
import math
import weakref

import numpy as np

from . import dtypes
from .errors import CapacityError

ON_CHIP = ("sbuf", "psum")
HBM = ("private_hbm", "shared_hbm")


_IDENTS = itertools.count(1)       # storage identities, unique over the process


class Storage:
    """Flat memory of one allocation (or one wrapped host array).

    ``ident`` names the physical buffer for the cost model's dependency tracking: unique per
    allocation, shared by the n-th allocation of every iteration of a device loop body (compiled
    once, so one buffer) and by everything placed in one buffer by address (``address`` then
    gives the position there)."""

    __slots__ = ("data", "shape", "buffer", "name", "address", "mm_written", "group_started",
                 "ident", "row_bytes", "shared_region", "__weakref__")

    def __init__(self, data: np.ndarray, shape, buffer: str, name: str = "", address=None,
                 ident=None):
        self.data = data            # 1-D, contiguous, of the allocation dtype
        self.shape = tuple(int(n) for n in shape)
        self.buffer = buffer        # "sbuf" | "psum" | "private_hbm" | "shared_hbm"
        self.name = name
        self.address = address
        self.mm_written = None      # PSUM: bool per element, True where nc_matmul wrote last
        self.group_started = None   # PSUM: bool per element, True where a matmul of this
        # allocation wrote (accumulate=None: the first overwrites, later ones add); reset by
        # every nl.ndarray that returns the storage (a new tensor starts new groups)
        self.ident = next(_IDENTS) if ident is None else ident
        self.shared_region = None   # placed and partly overlapping others: its _Region, synced
        # with them before every access
        self.row_bytes = math.prod(self.shape[1:]) * data.itemsize   # bytes per partition

    @property
    def dtype(self) -> np.dtype:
        return self.data.dtype

    def elements(self, dtype) -> np.ndarray:
        """The same bytes as a flat array of ``dtype``."""
        if dtype is self.data.dtype:
            return self.data
        dtype = np.dtype(dtype)
        return self.data if dtype == self.data.dtype else self.data.view(dtype)

    @classmethod
    def allocate(cls, shape, dtype, buffer: str, name: str = "", address=None) -> "Storage":
        dtype = np.dtype(dtype)
        size = math.prod(shape)
        data = np.full(size, dtypes.sentinel(dtype), dtype=dtype)
        return cls(data, shape, buffer, name, address)


_CLOCK = itertools.count()            # orders accesses to placed regions that share bytes


class _Region:
    """One placed region: its extent, the storages placed there (sharing ``data``) and the
    regions it partly overlaps (``peers``), kept coherent by ``sync`` on every access."""

    __slots__ = ("buffer", "partitions", "start", "nbytes", "amount", "live", "data", "last",
                 "storages", "peers", "stamp", "refunded")

    def __init__(self, buffer, partitions, start, nbytes, amount, data):
        self.buffer, self.partitions, self.start, self.nbytes = buffer, partitions, start, nbytes
        self.amount = amount                # capacity charged: bytes (SBUF) or banks (PSUM)
        self.live = 0                       # storages placed here and not yet freed
        self.data = data                    # the region's bytes (shared by those storages)
        self.last = None                    # weakref to the newest of them
        self.storages = []                  # weakrefs to all of them
        self.peers = []                     # regions sharing some of these bytes
        self.stamp = -1                     # _CLOCK at the last access (-1: never accessed)
        self.refunded = False               # capacity returned (freed, or covered by a peer)

    def overlaps(self, partitions, start, nbytes) -> bool:
        p0, p1 = self.partitions
        return (p0 < partitions[1] and partitions[0] < p1
                and self.start < start + nbytes and start < self.start + self.nbytes)

    def rows(self):
        """The region's bytes as [partitions, nbytes] uint8."""
        return self.data.view(np.uint8).reshape(self.partitions[1] - self.partitions[0],
                                                self.nbytes)

    def sync(self):
        """Before an access: take the shared bytes from every peer accessed since this region
        was (oldest first, so the newest wins); forget dead peers already taken in."""
        newer = sorted((p for p in self.peers if p.stamp > self.stamp), key=lambda p: p.stamp)
        if newer:
            mine = self.rows()
            for p in newer:
                p0 = max(p.partitions[0], self.partitions[0])
                p1 = min(p.partitions[1], self.partitions[1])
                b0, b1 = max(p.start, self.start), min(p.start + p.nbytes, self.start + self.nbytes)
                mine[p0 - self.partitions[0]:p1 - self.partitions[0], b0 - self.start:b1 - self.start] = \
                    p.rows()[p0 - p.partitions[0]:p1 - p.partitions[0], b0 - p.start:b1 - p.start]
        self.peers = [p for p in self.peers if p.live]
        self.stamp = next(_CLOCK)


def _watch(region):
    """Make every live storage of ``region`` sync it on access (it now has peers)."""
    for ref in region.storages:
        storage = ref()
        if storage is not None:
            storage.shared_region = region


class Memory:
    """Live on-chip bytes per partition of one program instance, with the peaks reached."""

    def __init__(self, target):
        self.target = target
        self.sbuf_live = 0
        self.psum_banks_live = 0
        self.sbuf_peak = 0
        self.psum_banks_peak = 0
        self.regions = {}                   # (buffer, partition offset, byte offset) -> _Region
        self.placed_idents = {}             # buffer -> ident of the whole buffer (placed tensors)

    # -- tensors placed by address ------------------------------------------------------------
    def place(self, shape, dtype, buffer, name, address, fail) -> Storage:
        """The storage of a tensor placed at ``address``: shared with the live tensors placed
        at the same address with the same extent; fresh (and counted) otherwise, kept coherent
        with the live ones it partly overlaps."""
        dtype = np.dtype(dtype)
        p_off, b_off = (int(a) for a in address)
        nbytes, parts = math.prod(shape[1:]) * dtype.itemsize, (p_off, p_off + int(shape[0]))
        limit = (self.target.psum_partition_bytes if buffer == "psum"
                 else self.target.sbuf_usable_bytes)
        if p_off < 0 or parts[1] > self.target.pmax or b_off < 0 or b_off + nbytes > limit:
            fail(CapacityError, f"{buffer} address {tuple(address)} with shape {tuple(shape)} "
                                f"{dtype.name} ({nbytes} B/partition) leaves the {buffer} "
                                f"({self.target.pmax} partitions x {limit} B)")
        if b_off % dtype.itemsize:
            fail(CapacityError, f"{buffer} address {tuple(address)}: byte offset must be a "
                                f"multiple of the {dtype.name} element size")
        ident = self.placed_idents.setdefault(buffer, next(_IDENTS))
        key = (buffer, p_off, b_off)
        region = self.regions.get(key)
        same = region is not None and (region.partitions, region.nbytes) == (parts, nbytes)
        if same and region.live:
            storage = Storage(region.data.view(dtype), shape, buffer, name, address, ident)
            last = region.last()
            if last is not None and last.dtype == dtype:
                storage.mm_written = last.mm_written
        else:
            covered = [other for other in self.regions.values()
                       if other.buffer == buffer and other.live
                       and other.overlaps(parts, b_off, nbytes)]
            storage = Storage.allocate(shape, dtype, buffer, name, address)
            storage.ident = ident
            region = _Region(buffer, parts, b_off, nbytes, self._amount(buffer, b_off, nbytes),
                             storage.data)
            for other in covered:              # one set of bytes: counted once, for the newest
                other.peers.append(region)
                region.peers.append(other)
                _watch(other)
                if not other.refunded:
                    other.refunded = True
                    self._refund(other.buffer, other.amount)
            self._charge(buffer, region.amount, storage, fail)
            self.regions[key] = region
        region.live += 1
        region.last = weakref.ref(storage)
        region.storages.append(region.last)
        if region.peers:
            storage.shared_region = region
        weakref.finalize(storage, self._leave_region, key, region)
        return storage

    def _leave_region(self, key, region):
        region.live -= 1
        if region.live == 0:
            if not region.refunded:
                region.refunded = True
                self._refund(region.buffer, region.amount)
            if self.regions.get(key) is region:
                del self.regions[key]

    # -- capacity: bytes per partition (SBUF) or banks (PSUM) -------------------------------
    def register(self, storage: Storage, fail) -> None:
        """Count ``storage`` until it is freed; ``fail(cls, message)`` raises when it does not fit."""
        if storage.buffer in ON_CHIP:
            amount = self._amount(storage.buffer, 0, storage.row_bytes)
            self._charge(storage.buffer, amount, storage, fail)
            weakref.finalize(storage, self._refund, storage.buffer, amount)

    def _amount(self, buffer, start, nbytes) -> int:
        """What ``nbytes`` per partition from byte ``start`` cost: bytes in SBUF, banks in PSUM."""
        if buffer == "sbuf":
            return nbytes
        bank = self.target.psum_bank_bytes
        return (start + nbytes - 1) // bank - start // bank + 1

    def _charge(self, buffer, amount, storage, fail):
        t = self.target
        if buffer == "sbuf":
            if self.sbuf_live + amount > t.sbuf_usable_bytes:
                fail(CapacityError,
                     f"SBUF over capacity: allocating {storage.name or 'a tensor'} of shape "
                     f"{storage.shape} {storage.dtype.name} ({amount} B/partition) with "
                     f"{self.sbuf_live} B/partition live exceeds {t.sbuf_usable_bytes} "
                     f"B/partition usable on {t.name}")
            self.sbuf_live += amount
            self.sbuf_peak = max(self.sbuf_peak, self.sbuf_live)
        else:
            if self.psum_banks_live + amount > t.psum_num_banks:
                fail(CapacityError,
                     f"PSUM over capacity: allocating {storage.name or 'a tensor'} of shape "
                     f"{storage.shape} {storage.dtype.name} ({amount} bank(s) of "
                     f"{t.psum_bank_bytes} B) with {self.psum_banks_live} of "
                     f"{t.psum_num_banks} banks live")
            self.psum_banks_live += amount
            self.psum_banks_peak = max(self.psum_banks_peak, self.psum_banks_live)

    def _refund(self, buffer, amount):
        if buffer == "sbuf":
            self.sbuf_live -= amount
        else:
            self.psum_banks_live -= amount
