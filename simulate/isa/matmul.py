"""TensorE instructions: ``nc_matmul`` and ``nc_transpose``.

``nc_matmul(dst, stationary, moving)``: ``dst[M, N] (+)= stationary[K, M].T @ moving[K, N]`` with K on
partitions, products accumulated in fp32 in PSUM. ``accumulate=None`` (auto) overwrites a PSUM
element the first time a matmul writes it and adds afterwards; a write by any other instruction
ends the accumulation group. ``accumulate=True`` onto PSUM not last written by a matmul is
undefined behaviour on NeuronCore-v2/v3, so it raises here.
"""

from __future__ import annotations

import numpy as np

from .. import context, dtypes
from .core import as_2d, engine_name, fail, free_elems, on_chip, record
from .enums import matmul_perf_mode

MATMUL_INPUTS = {dtypes.float8_e4m3, dtypes.float8_e4m3fn, dtypes.float8_e5m2, dtypes.bfloat16,
                 dtypes.float16, dtypes.float32}


def _check_dtypes(op, stationary, moving, dst, target):
    for role, t in (("stationary", stationary), ("moving", moving)):
        if t.dtype not in MATMUL_INPUTS:
            fail(f"dtype {t.dtype.name} is not a matmul input type (fp8/bf16/fp16/fp32)", op, role)
    if (stationary.dtype == dtypes.float32) != (moving.dtype == dtypes.float32):
        fail(f"fp32 must pair with fp32: stationary {stationary.dtype.name}, moving "
             f"{moving.dtype.name}", op)
    allowed = (dtypes.float32,) if target.nc_version < 4 else (dtypes.float32, dtypes.bfloat16)
    if dst.dtype not in allowed:
        fail(f"dst dtype {dst.dtype.name} must be {' or '.join(d.name for d in allowed)} on "
             f"{target.name}", op, "dst")


def _check_bank(op, d, target):
    """The dst row must sit inside one 2 KiB PSUM bank."""
    t = d.tensor
    itemsize = t.dtype.itemsize
    per_partition = int(np.prod(t._storage.shape[1:])) * t._storage.dtype.itemsize // itemsize
    start = (d.offset % per_partition) * itemsize
    end = start + free_elems(d) * itemsize - 1
    if start // target.psum_bank_bytes != end // target.psum_bank_bytes:
        fail(f"dst bytes {start}..{end} of each partition cross a {target.psum_bank_bytes} B "
             f"PSUM bank boundary", op, "dst")


def nc_matmul(dst, stationary, moving, is_stationary_onezero=False, is_moving_onezero=False,
              is_transpose=False, accumulate=None, tile_position=(), tile_size=(),
              perf_mode=matmul_perf_mode.none, name=None):
    """``dst[M, N] = stationary[K, M].T @ moving[K, N]`` (fp32 accumulation in PSUM)."""
    op = "nc_matmul"
    target = context.current().target
    s = on_chip(stationary, op, "stationary", ("sbuf",))
    m = on_chip(moving, op, "moving", ("sbuf",))
    d = on_chip(dst, op, "dst", ("psum",))
    K, M, N = stationary.shape[0], free_elems(s), free_elems(m)
    if moving.shape[0] != K:
        fail(f"contraction (partition) sizes differ: stationary K={K}, moving K={moving.shape[0]}", op)
    if K > target.pmax:
        fail(f"K={K} exceeds {target.pmax} partitions", op, "stationary")
    if M > target.gemm_stationary_fmax:
        fail(f"stationary free size M={M} exceeds {target.gemm_stationary_fmax}", op, "stationary")
    if N > target.gemm_moving_fmax:
        fail(f"moving free size N={N} exceeds {target.gemm_moving_fmax}", op, "moving")
    if dst.shape[0] != M or free_elems(d) != N:
        fail(f"dst {dst.shape} must be [M={M}, N={N}]", op, "dst")
    _check_dtypes(op, stationary, moving, dst, target)
    if matmul_perf_mode(perf_mode) == matmul_perf_mode.double_row:
        if target.nc_version < 3 or stationary.dtype.itemsize != 1:
            fail("perf_mode=double_row needs NeuronCore-v3+ and fp8 inputs", op, "perf_mode")
    _check_bank(op, d, target)
    a = as_2d(s.read()).astype(np.float32)
    b = as_2d(m.read()).astype(np.float32)
    product = (a.T @ b).astype(np.float32)
    _accumulate(op, d, product, accumulate, target)
    return record(op, "tensor", {"dst": d, "stationary": s, "moving": m}, name=name,
                  partitions=K, free_elems=N, flops=2 * K * M * N,
                  details={"M": M, "is_transpose": bool(is_transpose)})


def _accumulate(op, d, product, accumulate, target):
    storage = d.tensor._storage
    if storage.mm_written is None:
        storage.mm_written = np.zeros(storage.data.size, dtype=bool)
    idx = d.flat_indices().reshape(product.shape)
    written = storage.mm_written[idx]
    if accumulate is True and not written.all() and target.nc_version < 4:
        fail("accumulate=True onto PSUM not last written by nc_matmul is undefined on "
             "NeuronCore-v2/v3 (first matmul of a group must overwrite)", op, "dst")
    old = as_2d(d.read()).astype(np.float32)
    if accumulate is False:
        out = product
    elif accumulate is True:
        out = old + product
    else:
        out = np.where(written, old + product, product)
    d.write(dtypes.cast(out, d.dtype).reshape(d.shape))    # clears mm_written for these elements
    storage.mm_written[idx] = True


def nc_transpose(dst, data, engine=None, name=None):
    """``dst[F, P] = data[P, F]``: TensorE (SBUF -> PSUM, <= 128 x 128) or VectorE (<= 32 x 32)."""
    op = "nc_transpose"
    eng = engine_name(engine, "tensor", ("tensor", "vector"), op)
    src_bufs, dst_bufs = (("sbuf",), ("psum",)) if eng == "tensor" else (("sbuf", "psum"),) * 2
    s = on_chip(data, op, "data", src_bufs)
    d = on_chip(dst, op, "dst", dst_bufs)
    P, F = data.shape[0], free_elems(s)
    limit = 128 if eng == "tensor" else 32
    if P > limit or F > limit:
        fail(f"[{P}, {F}] exceeds the {eng} engine transpose limit {limit} x {limit}", op, "data")
    if dst.shape[0] != F or free_elems(d) != P:
        fail(f"dst {dst.shape} must be [{F}, {P}]", op, "dst")
    if dst.dtype != data.dtype:
        fail(f"dst dtype {dst.dtype.name} must equal data dtype {data.dtype.name}", op, "dst")
    d.write(as_2d(s.read()).T.reshape(dst.shape))
    return record(op, eng, {"dst": d, "data": s}, name=name, partitions=P, free_elems=F)
