"""The selective-scan (Mamba SSM) kernel of the NKI fused-Mamba tutorial, written here in Beta 2
NKI for calibration: AWS publishes its measured device time at several sizes, so the cost model
can be compared with hardware on the same instruction stream.

Shapes: delta, u [batch, channels, seq] fp32; A [channels, state]; B, C [batch, state, seq].
out[b, c, t] = sum_n C[b, n, t] * h[b, c, n, t], h_t = exp(delta_t A[c, n]) h_{t-1}
+ delta_t u_t B[b, n, t], h_{-1} = 0.

Per (channel tile of 128, state) the kernel issues what the tutorial's ``mamba_v1`` does:
ScalarE exp(delta * A) with A as the per-partition scale, VectorE delta*u, *B, the scan, *C and
the accumulation over states; B and C rows are broadcast to 128 partitions by the DMA.
``order="state_outer"`` is mamba_v1's loop order (delta and u reloaded per state);
``"tile_outer"`` is mamba_v2's (loaded once per channel tile).
"""

from __future__ import annotations

import numpy as np

from nki_kernels.backend import nki, nisa, nl


def mamba_inputs(rng, batch: int, channels: int, seq: int, state: int):
    """(delta, u, A, B, C) fp32 in the ranges a trained Mamba layer sees (delta small and
    positive, A negative, so the scan is stable)."""
    delta = rng.uniform(0.01, 0.1, (batch, channels, seq)).astype(np.float32)
    u = rng.standard_normal((batch, channels, seq)).astype(np.float32)
    A = -rng.uniform(0.5, 2.0, (channels, state)).astype(np.float32)
    B = rng.standard_normal((batch, state, seq)).astype(np.float32)
    C = rng.standard_normal((batch, state, seq)).astype(np.float32)
    return delta, u, A, B, C


def mamba_ref(delta, u, A, B, C) -> np.ndarray:
    """Float64 reference by the recurrence."""
    delta, u, A, B, C = (np.asarray(x, np.float64) for x in (delta, u, A, B, C))
    dA = np.exp(delta[:, :, None, :] * A[None, :, :, None])          # [b, c, n, t]
    dBu = (delta * u)[:, :, None, :] * B[:, None, :, :]
    h = np.zeros(dA.shape[:3])
    out = np.zeros(delta.shape)
    for t in range(delta.shape[2]):
        h = dA[..., t] * h + dBu[..., t]
        out[:, :, t] = np.einsum("bcn,bn->bc", h, C[:, :, t])
    return out


def _row_to_partitions(src, b, n, seq, name):
    """Row [b, n, :] of a [batch, state, seq] tensor, broadcast to 128 partitions by the DMA."""
    tile = nl.ndarray((128, seq), nl.float32, buffer=nl.sbuf, name=name)
    state = src.shape[1]
    nisa.dma_copy(dst=tile, src=src.ap([[0, 128], [1, seq]], offset=(b * state + n) * seq))
    return tile


def _step(delta_i, u_i, a_i, B, C, b, n, acc, seq):
    """Fold state n of a channel tile into ``acc``."""
    f32 = nl.float32
    delta_a = nl.ndarray((128, seq), f32, buffer=nl.sbuf, name="deltaA")
    nisa.activation(dst=delta_a, op=nl.exp, data=delta_i, scale=a_i)
    b_row = _row_to_partitions(B, b, n, seq, "B_row")
    delta_u = nl.ndarray((128, seq), f32, buffer=nl.sbuf, name="deltaU")
    nisa.tensor_tensor(dst=delta_u, data1=delta_i, data2=u_i, op=nl.multiply)
    delta_bu = nl.ndarray((128, seq), f32, buffer=nl.sbuf, name="deltaBu")
    nisa.tensor_tensor(dst=delta_bu, data1=delta_u, data2=b_row, op=nl.multiply)
    scan = nl.ndarray((128, seq), f32, buffer=nl.sbuf, name="scan")
    nisa.tensor_tensor_scan(dst=scan, data0=delta_a, data1=delta_bu, initial=0.0,
                            op0=nl.multiply, op1=nl.add)
    c_row = _row_to_partitions(C, b, n, seq, "C_row")
    scan_c = nl.ndarray((128, seq), f32, buffer=nl.sbuf, name="scanC")
    nisa.tensor_tensor(dst=scan_c, data1=scan, data2=c_row, op=nl.multiply)
    nisa.tensor_tensor(dst=acc, data1=acc, data2=scan_c, op=nl.add)


def _load(src, b, c0, seq, name):
    tile = nl.ndarray((128, seq), nl.float32, buffer=nl.sbuf, name=name)
    nisa.dma_copy(dst=tile, src=src[b, c0:c0 + 128, 0:seq])
    return tile


def _scale(A, c0, n):
    a_i = nl.ndarray((128, 1), nl.float32, buffer=nl.sbuf, name="A_col")
    nisa.dma_copy(dst=a_i, src=A[c0:c0 + 128, n:n + 1])
    return a_i


@nki.jit
def mamba_kernel(delta, u, A, B, C, order):
    batch, channels, seq = delta.shape
    state = A.shape[1]
    assert channels % 128 == 0, "channels must be a multiple of 128"
    out = nl.ndarray((batch, channels, seq), nl.float32, buffer=nl.shared_hbm, name="out")
    tiles = range(0, channels, 128)
    for b in range(batch):
        accs = []
        for _ in tiles:
            acc = nl.ndarray((128, seq), nl.float32, buffer=nl.sbuf, name="acc")
            nisa.memset(dst=acc, value=0.0)
            accs.append(acc)
        if order == "state_outer":
            for n in range(state):
                for j in range(len(accs)):
                    c0 = tiles[j]
                    _step(_load(delta, b, c0, seq, "delta"), _load(u, b, c0, seq, "u"),
                          _scale(A, c0, n), B, C, b, n, accs[j], seq)
        else:
            for j in range(len(accs)):
                c0 = tiles[j]
                delta_i, u_i = _load(delta, b, c0, seq, "delta"), _load(u, b, c0, seq, "u")
                for n in range(state):
                    _step(delta_i, u_i, _scale(A, c0, n), B, C, b, n, accs[j], seq)
        for j in range(len(accs)):
            c0 = tiles[j]
            nisa.dma_copy(dst=out[b, c0:c0 + 128, 0:seq], src=accs[j])
    return out
