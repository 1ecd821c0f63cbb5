"""Storage behind tensors and the per-instance SBUF/PSUM capacity accounting.

A tensor allocation is one ``Storage``: a flat NumPy array plus its buffer and allocation shape.
On-chip capacity is counted per partition: an SBUF allocation of shape ``(P, f...)`` holds
``prod(f) * itemsize`` bytes in each partition it may use, and live allocations must fit in the
target's usable SBUF (``tile_size.total_available_sbuf_size``). A PSUM allocation occupies whole
2 KiB banks; live ones must fit in the 8 banks.

Liveness is the compiler's: a tile is live from the first instruction that touches it to the
last one, in program order (an instruction's operands, its dynamic-offset tables, a
``scalar_load`` / ``scalar_store``), as the Neuron compiler's allocator frees a tile after its
last use (the NKI guides' memory model: tiles are allocated by the compiler, and their lifetime
ends at their last use; a device loop's body is compiled once, so a tile its iterations reuse is
one buffer, live across them). A tile still bound to a Python name but never used again holds
nothing, and a tile never touched is never live. The check runs when a program instance ends:
a point where the tiles live at once exceed the capacity raises a ``CapacityError`` naming the
tile whose first use crossed it, its kernel line and the tiles live there.

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
                 "ident", "row_bytes", "shared_region", "life", "__weakref__")

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
        self.life = None            # an allocator tile's Lifetime (its first and last use)

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


class Lifetime:
    """An allocator tile's capacity (``amount``: bytes per partition in SBUF, banks in PSUM)
    and the instructions that first and last touched it (``first`` / ``last``: the instance's
    instruction count; None: never touched), with the kernel line of its first use."""

    __slots__ = ("buffer", "amount", "name", "shape", "dtype", "first", "last", "site")

    def __init__(self, storage, amount):
        self.buffer, self.amount = storage.buffer, amount
        self.name, self.shape, self.dtype = storage.name, storage.shape, storage.dtype.name
        self.first = self.last = self.site = None

    def label(self) -> str:
        return f"{self.name or 'a tile'} {self.shape} {self.dtype}"


def note_use(storage, time, site) -> None:
    """An instruction at ``time`` touched ``storage`` (``site()``: its kernel line, asked only
    at the first use)."""
    life = storage.life
    if life is not None:
        if life.first is None:
            life.first, life.site = time, site()
        life.last = time


class _Region:
    """One placed region: its extent, the storages placed there (sharing ``data``) and the
    regions it partly overlaps (``peers``), kept coherent by ``sync`` on every access."""

    __slots__ = ("buffer", "partitions", "start", "nbytes", "amount", "live", "data", "last",
                 "storages", "peers", "stamp", "refunded", "span")

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
        self.span = None                    # Memory.placed_spans entry (in a kernel)

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

    def __init__(self, target, now=None):
        self.target = target
        self.now = now                      # the instance's instruction count; None: outside
        self.lifetimes = []                 # allocator tiles (liveness-counted), in kernels
        self.placed_spans = []              # [buffer, amount, placed at, freed at or None]
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
                    self._refund(other.buffer, other.amount, other.span)
            self._charge(buffer, region.amount, storage, fail)
            self.regions[key] = region
            region.span = self._span(buffer, region.amount)
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
                self._refund(region.buffer, region.amount, region.span)
            if self.regions.get(key) is region:
                del self.regions[key]

    # -- capacity: bytes per partition (SBUF) or banks (PSUM) -------------------------------
    def register(self, storage: Storage, fail) -> None:
        """Count an allocator tile: in a kernel by its liveness (``Lifetime``, checked when the
        instance ends by ``check_liveness``), outside one while it is referenced;
        ``fail(cls, message)`` raises when it cannot fit."""
        if storage.buffer not in ON_CHIP:
            return
        amount = self._amount(storage.buffer, 0, storage.row_bytes)
        if self.now is None:
            self._charge(storage.buffer, amount, storage, fail)
            weakref.finalize(storage, self._refund, storage.buffer, amount)
            return
        capacity = self._capacity(storage.buffer)
        if amount > capacity:                # can never fit, whatever else is live
            self._charge(storage.buffer, amount, storage, fail)
        storage.life = Lifetime(storage, amount)
        self.lifetimes.append(storage.life)

    def _capacity(self, buffer) -> int:
        return (self.target.sbuf_usable_bytes if buffer == "sbuf"
                else self.target.psum_num_banks)

    def _span(self, buffer, amount):
        if self.now is None:
            return None
        span = [buffer, amount, self.now(), None]
        self.placed_spans.append(span)
        return span

    def check_liveness(self, program_id) -> None:
        """Sweep the instance's tiles in program order (placed regions from placement to
        release, allocator tiles from first to last use); set the peaks, and raise a
        ``CapacityError`` where the tiles live at once exceed the target's SBUF or PSUM."""
        for buffer in ON_CHIP:
            events = []
            for life in self.lifetimes:
                if life.buffer == buffer and life.first is not None:
                    events.append((life.first, 1, life))
                    events.append((life.last + 1, 0, life))
            for span in self.placed_spans:
                if span[0] == buffer:
                    events.append((span[2], 1, span))
                    if span[3] is not None:
                        events.append((span[3], 0, span))
            events.sort(key=lambda e: (e[0], e[1]))
            live, total, peak = {}, 0, 0
            for _, add, what in events:
                amount = what.amount if isinstance(what, Lifetime) else what[1]
                if not add:
                    total -= amount
                    del live[id(what)]
                    continue
                live[id(what)] = what
                total += amount
                peak = max(peak, total)
                if total > self._capacity(buffer) and isinstance(what, Lifetime):
                    self._over(buffer, what, total, live, program_id)
            if buffer == "sbuf":
                self.sbuf_peak = max(self.sbuf_peak, peak)
            else:
                self.psum_banks_peak = max(self.psum_banks_peak, peak)

    def _over(self, buffer, life, total, live, program_id):
        t = self.target
        others = [w.label() if isinstance(w, Lifetime) else "a placed region"
                  for w in live.values() if w is not life]
        shown = ", ".join(others[:8]) + (f" and {len(others) - 8} more" if len(others) > 8
                                         else "")
        if buffer == "sbuf":
            message = (f"SBUF over capacity: {life.label()} ({life.amount} B/partition) is "
                       f"first used with {total - life.amount} B/partition live "
                       f"({shown}), exceeding {t.sbuf_usable_bytes} B/partition usable on "
                       f"{t.name} (tiles are live from their first use to their last)")
        else:
            message = (f"PSUM over capacity: {life.label()} ({life.amount} bank(s) of "
                       f"{t.psum_bank_bytes} B) is first used with {total - life.amount} of "
                       f"{t.psum_num_banks} banks live ({shown}) (tiles are live from their "
                       f"first use to their last)")
        raise CapacityError(message, op="nl.ndarray", operand=life.name or None,
                            program_id=program_id, location=life.site)

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

    def _refund(self, buffer, amount, span=None):
        if span is not None and span[3] is None and self.now is not None:
            span[3] = self.now()
        if buffer == "sbuf":
            self.sbuf_live -= amount
        else:
            self.psum_banks_live -= amount
