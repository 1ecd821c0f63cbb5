"""TensorE instructions: ``nc_matmul`` and ``nc_transpose``.

``nc_matmul(dst, stationary, moving)``: ``dst[M, N] (+)= stationary[K, M].T @ moving[K, N]`` with K
on partitions (SBUF inputs, PSUM dst), products accumulated in fp32. With ``perf_mode=double_row``
(NeuronCore-v3+, fp8) the inputs are ``[K, 2, M]`` / ``[K, 2, N]`` and the contraction runs over
both the partitions and that axis of 2.

Accumulation: ``accumulate=False`` overwrites, ``True`` adds, ``None`` (auto) overwrites a PSUM
element the first time a matmul writes it through this tensor (this ``nl.ndarray`` allocation)
and adds afterwards; a write by any other instruction ends the accumulation group, and so does a
new allocation: a tensor placed by address where an earlier one lay starts afresh, as does a
device loop body's tensor on each iteration (nki-library's attention_tkg allocates its QK PSUM
per batch at one address and relies on this). Choice: ``accumulate=True`` onto PSUM not last written by a matmul
(uninitialised, or memset/copied) is undefined on NeuronCore-v2/v3, so it raises there.

``is_transpose=True`` on NeuronCore-v3+ is TensorE's bit-exact transpose mode: ``moving`` must be
an identity [K, K] and ``dst = stationary.T`` (dst dtype fp32 or the input's). On v2 it is only a
profiler label and the instruction is an ordinary matmul.
"""

from __future__ import annotations

import math

import numpy as np

from .. import context, dtypes
from .core import as_2d, engine_name, fail, free_elems, on_chip, record
from .enums import matmul_perf_mode

FP8 = (dtypes.float8_e4m3, dtypes.float8_e5m2, dtypes.float8_e4m3fn)
MATMUL_INPUTS = FP8 + (dtypes.bfloat16, dtypes.float16, dtypes.float32)


def _check_dtypes(op, stationary, moving, dst, target, double_row, transpose):
    for role, t in (("stationary", stationary), ("moving", moving)):
        if t.dtype not in MATMUL_INPUTS:
            fail(f"dtype {t.dtype.name} is not a matmul input type (fp8/bf16/fp16/tf32/fp32)",
                 op, role)
        if t.dtype == dtypes.float8_e4m3fn and target.nc_version < 4:
            fail(f"float8_e4m3fn inputs need NeuronCore-v4+ ({target.name} is "
                 f"v{target.nc_version})", op, role)
        if double_row and t.dtype not in FP8:
            fail(f"perf_mode=double_row needs fp8 inputs, {role} is {t.dtype.name}", op, role)
    pair = {stationary.dtype, moving.dtype}
    if pair == {dtypes.float8_e4m3, dtypes.float8_e4m3fn}:
        fail("float8_e4m3 and float8_e4m3fn cannot be mixed in one matmul", op)
    if (stationary.dtype == dtypes.float32) != (moving.dtype == dtypes.float32):
        fail(f"fp32 must pair with fp32: stationary {stationary.dtype.name}, moving "
             f"{moving.dtype.name}", op)
    allowed = [dtypes.float32] if target.nc_version < 4 else [dtypes.float32, dtypes.bfloat16]
    if transpose and target.nc_version >= 3:      # v2 has no PE transpose mode: fp32 dst only
        allowed.append(stationary.dtype)
    if dst.dtype not in allowed:
        fail(f"dst dtype {dst.dtype.name} must be {' or '.join(d.name for d in allowed)} on "
             f"{target.name}", op, "dst")


def _check_bank(op, d, target):
    """NeuronCore-v2/v3: each partition's dst row must sit inside one 2 KiB PSUM bank."""
    t = d.tensor
    itemsize = t.dtype.itemsize
    per_partition = math.prod(t._storage.shape[1:]) * t._storage.dtype.itemsize // itemsize
    start = (d.offset % per_partition) * itemsize
    end = start + free_elems(d) * itemsize - 1
    if start // target.psum_bank_bytes != end // target.psum_bank_bytes:
        fail(f"dst bytes {start}..{end} of each partition cross a {target.psum_bank_bytes} B "
             f"PSUM bank boundary", op, "dst")


def _check_tiling(op, tile_position, tile_size, K, M, double_row, target):
    """Row/column tiling of the 128x128 PE array: both fields or neither."""
    if not tile_position and not tile_size:
        return
    if not (tile_position and tile_size) or len(tile_position) != 2 or len(tile_size) != 2:
        fail("tile_position=(row, col) and tile_size=(rows, cols) must be set together",
             op, "tile_size")
    sizes = (128, 64) if target.nc_version < 3 else (128, 64, 32)
    for k, axis in enumerate(("row", "column")):
        size, start = int(tile_size[k]), int(tile_position[k])
        if size not in sizes:
            fail(f"{axis} tile size {size} must be one of {sizes} on {target.name}", op,
                 "tile_size")
        if start % size or start + size > 128:
            fail(f"{axis} tile start {start} must be a multiple of {size} inside the 128 PE "
                 f"{axis}s", op, "tile_position")
    if K > tile_size[0]:
        fail(f"K={K} exceeds the row tile size {tile_size[0]}", op, "stationary")
    if M > tile_size[1]:
        fail(f"M={M} exceeds the column tile size {tile_size[1]}", op, "stationary")
    if double_row and tile_size[1] != 128:
        fail("perf_mode=double_row cannot be combined with column tiling", op, "perf_mode")


def _check_onezero(op, role, values):
    if not np.isin(values, (0.0, 1.0)).all():
        fail(f"is_{role}_onezero=True but {role} holds values other than 0 and 1", op, role)


def nc_matmul(dst, stationary, moving, is_stationary_onezero=False, is_moving_onezero=False,
              is_transpose=False, accumulate=None, tile_position=(), tile_size=(),
              perf_mode=matmul_perf_mode.none, name=None):
    """``dst[M, N] = stationary[K, M].T @ moving[K, N]`` (fp32 accumulation in PSUM)."""
    op = "nc_matmul"
    target = context.current().target
    s = on_chip(stationary, op, "stationary", ("sbuf",))
    m = on_chip(moving, op, "moving", ("sbuf",))
    d = on_chip(dst, op, "dst", ("psum",))
    double_row = matmul_perf_mode(perf_mode) == matmul_perf_mode.double_row
    transpose = bool(is_transpose) and target.nc_version >= 3
    K = stationary.shape[0]
    if moving.shape[0] != K:
        fail(f"contraction (partition) sizes differ: stationary K={K}, moving K={moving.shape[0]}",
             op)
    a = as_2d(s.read_as(np.float32))
    b = as_2d(m.read_as(np.float32))
    if double_row:
        if target.nc_version < 3:
            fail(f"perf_mode=double_row needs NeuronCore-v3+ ({target.name} is v2)", op,
                 "perf_mode")
        for role, t in (("stationary", stationary), ("moving", moving)):
            if t.ndim != 3 or t.shape[1] != 2:
                fail(f"double_row needs {role} laid out [K, 2, free], got {t.shape}", op, role)
        a, b = a.reshape(2 * K, -1), b.reshape(2 * K, -1)
    M, N = a.shape[1], b.shape[1]
    if M > target.gemm_stationary_fmax:
        fail(f"stationary free size M={M} exceeds {target.gemm_stationary_fmax}", op, "stationary")
    n_max = target.matmul_moving_max * (2 if dst.dtype == dtypes.bfloat16 else 1)
    if N > n_max:
        fail(f"moving free size N={N} exceeds {n_max} on {target.name}", op, "moving")
    if dst.shape[0] != M or free_elems(d) != N:
        fail(f"dst {dst.shape} must be [M={M}, N={N}]", op, "dst")
    _check_dtypes(op, stationary, moving, dst, target, double_row, transpose)
    _check_tiling(op, tile_position, tile_size, K, M, double_row, target)
    if target.nc_version < 4:
        _check_bank(op, d, target)
    if is_stationary_onezero:
        _check_onezero(op, "stationary", a)
    if is_moving_onezero:
        _check_onezero(op, "moving", b)
    if transpose:
        if N != K or not np.array_equal(b, np.eye(K, dtype=np.float32)):
            fail(f"is_transpose=True needs an identity moving tile [{K}, {K}]", op, "moving")
        d.write(dtypes.cast(as_2d(s.read()).T, dst.dtype).reshape(dst.shape))
    else:
        with np.errstate(all="ignore"):
            product = (a.T @ b).astype(np.float32, copy=False)
        _accumulate(op, d, product, accumulate, target)
    return record(op, "tensor", {"dst": d, "stationary": s, "moving": m}, name=name,
                  partitions=K, free_elems=N, flops=2 * a.shape[0] * M * N,
                  details={"M": M, "is_transpose": bool(is_transpose), "double_row": double_row})


_F32 = np.dtype(np.float32)
_NOT_ACCUMULATING = ("accumulate=True onto PSUM not last written by nc_matmul (uninitialised, or "
                     "written by another instruction) is undefined on NeuronCore-v2/v3; start the "
                     "accumulation group with accumulate=False or None")


def _accumulate(op, d, product, accumulate, target):
    """Write ``product`` into PSUM ``d``: ``accumulate=False`` overwrites, ``True`` adds, ``None``
    (auto) adds where a matmul into this allocation (this ``nl.ndarray``) wrote last and
    overwrites elsewhere: a new tensor placed where an earlier one was starts afresh (the
    compiler decides the mode per tensor). ``True`` onto PSUM last written by another
    instruction is undefined on NeuronCore-v2/v3 (refused)."""
    storage = d.tensor._storage
    if storage.mm_written is None:
        storage.mm_written = np.zeros(storage.data.size, dtype=bool)
    if storage.group_started is None:
        storage.group_started = np.zeros(storage.data.size, dtype=bool)
    views = d.flag_view(storage.mm_written), d.flag_view(storage.group_started)
    if views[0] is not None and d.dtype == _F32 and accumulate is not None:
        # the common case, an fp32 PSUM view and an explicit mode: in place on the storage
        if accumulate is True and target.nc_version < 4 and not views[0].all():
            fail(_NOT_ACCUMULATING, op, "dst")
        psum = d._strided()
        if accumulate is True:
            psum += product.reshape(psum.shape)
        else:
            psum[...] = product.reshape(psum.shape)
        views[0][...] = True
        views[1][...] = True
        return
    idx = d.flat_indices().reshape(product.shape) if views[0] is None else None
    if idx is None:
        written, started = (v.reshape(product.shape) for v in views)
    else:
        written, started = storage.mm_written[idx], storage.group_started[idx]
    if accumulate is True:
        if target.nc_version < 4 and not written.all():
            fail(_NOT_ACCUMULATING, op, "dst")
        adds = True
    elif accumulate is False:
        adds = False
    else:                                   # auto: add where this tensor's matmul wrote last
        both = started & written
        adds = True if both.all() else (both if both.any() else False)
    if adds is False:
        out = product
    else:
        old = d.read_as(np.float32).reshape(product.shape)
        out = old + product if adds is True else np.where(adds, old + product, product)
    d.write(dtypes.cast(out, d.dtype).reshape(d.shape))    # clears mm_written for these elements
    if idx is None:
        views[0][...] = True
        views[1][...] = True
    else:
        storage.mm_written[idx] = True
        storage.group_started[idx] = True


def nc_transpose(dst, data, engine=None, name=None):
    """``dst[F, P] = data[P, F]`` (free axes flattened): TensorE (SBUF -> PSUM, <= 128 x 128) or
    VectorE (SBUF/PSUM, <= 32 x 32); dst dtype == data dtype. NeuronCore-v2 TensorE transposes
    through a matmul with the identity, so NaN/Inf spread along their row there."""
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
    target = context.current().target
    if eng == "tensor" and target.nc_version == 2:
        if dst.dtype != dtypes.float32:       # v2 PE: a matmul with the identity, fp32 PSUM out
            fail(f"dst dtype {dst.dtype.name}: a TensorE transpose on NeuronCore-v2 writes fp32 "
                 f"PSUM (16-bit transpose mode exists from NeuronCore-v3)", op, "dst")
    elif dst.dtype != data.dtype:
        fail(f"dst dtype {dst.dtype.name} must equal data dtype {data.dtype.name}", op, "dst")
    values = as_2d(s.read())
    if eng == "tensor" and target.nc_version == 2 and dtypes.is_float(data.dtype):
        wide = values.astype(np.float32)
        if np.isfinite(wide).all():           # the identity matmul is then an exact transpose
            out = dtypes.cast(wide.T, dst.dtype)
        else:
            with np.errstate(all="ignore"):
                out = dtypes.cast(wide.T @ np.eye(P, dtype=np.float32), dst.dtype)
    else:
        out = values.T
    d.write(out.reshape(dst.shape))
    return record(op, eng, {"dst": d, "data": s}, name=name, partitions=P, free_elems=F,
                  details={"M": P} if eng == "tensor" else {})
