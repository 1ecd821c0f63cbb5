"""The append's launch plan: each token's cache row padded to the token bucket (one compile
per bucket), and how K and V rows are packed into one scatter."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from nki_kernels.backend import nisa
from nki_kernels.buckets import bucket
from nki_kernels.paged_cache.layout import CacheGeometry

from .kernel import P_MAX, SKIP_SLOT, packed_parts


def packing(geo: CacheGeometry, tokens: int, quantized: bool = False, lnc: int = 1) -> int:
    """``parts`` for the kernel: > 0 when a bucket of ``tokens`` K/V rows of a fused cache goes
    out in one DMA (NeuronCore-v3+, one core, no quantization, K and V on <= 128 partitions;
    ``kernel.packed_parts``), else 0 (one DMA per K and per V)."""
    if not geo.fused or quantized or lnc != 1 or _host_nc_version() < 3:
        return 0
    return packed_parts(tokens, geo.num_heads)


def _host_nc_version() -> int:
    """The target's NeuronCore version as host code sees it (the simulator's selected target);
    0 where the backend cannot tell outside a kernel, which keeps the write unpacked (correct on
    every target)."""
    try:
        return int(nisa.get_nc_version())
    except Exception:                   # the Neuron SDK outside a kernel: unknown
        return 0


def padded_slots(rows, keep, geo: CacheGeometry, spare_page=None, quantized=False, lnc=1):
    """(slots, counts, parts) for a token bucket Tb = ``bucket_tokens(T)``: [Tb, 1] int32
    slots, or with ``parts`` > 0 (``packing``: the one place the write is packed or not) the
    packed write's [2 * Tb * parts, 1] destinations; the [1, 2] counts table (real tokens,
    128-token tiles). Skipped and padded tokens get SKIP_SLOT, or with ``spare_page`` a row of
    that page (entry t mod P), so nothing relies on ``oob_mode.skip`` (NxD Inference's way: the
    allocator reserves the page)."""
    T = int(rows.shape[0])
    Tb = bucket_tokens(T)
    real = np.asarray(rows, np.int64)
    if keep is not None:
        real = np.where(keep, real, -1)
    slots = np.full(Tb, -1, np.int64)
    slots[:T] = real
    dropped = slots < 0
    if spare_page is None:
        slots[dropped] = SKIP_SLOT
    else:
        entries = np.arange(Tb) % geo.page_size
        slots[dropped] = geo.rows(np.full(Tb, spare_page), entries)[dropped]
    counts = np.array([[T, -(-T // min(P_MAX, Tb))]], np.int32)
    parts = packing(geo, Tb, quantized, lnc)
    if parts:
        return geo.packed_slots(slots, parts, SKIP_SLOT), counts, parts
    return slots.astype(np.int32).reshape(-1, 1), counts, 0


def bucket_tokens(T: int) -> int:
    """The token bucket ``padded_slots`` pads T rows to."""
    Tb = bucket(T)
    return -(-Tb // P_MAX) * P_MAX if Tb > P_MAX else Tb


@dataclass(frozen=True)
class AppendLaunch:
    """The scatter kernel's table arguments for T rows padded to ``tokens`` (``padded_slots``),
    the quantization table and limit (``paged_cache.quantize.quant_table``), and the packing."""

    slots: np.ndarray
    counts: np.ndarray
    parts: int
    quant: object
    limit: float
    tokens: int


def plan_append(rows, keep, geo: CacheGeometry, quant=(None, 0.0), spare_page=None,
                lnc=1) -> AppendLaunch:
    """The launch of an append whose tokens go to cache ``rows`` (``keep`` False: skipped);
    the NumPy entries and the torch device path run the same one (``api.launch_append``)."""
    slots, counts, parts = padded_slots(rows, keep, geo, spare_page, quant[0] is not None, lnc)
    return AppendLaunch(slots, counts, parts, quant[0], quant[1], bucket_tokens(len(rows)))
