"""Helpers for instruction tests: run a body of nisa calls inside a one-instance kernel."""

import numpy as np

from nki_kernels import simulate
from nki_kernels.simulate import jit, nisa, nl


def run(body, *arrays, target=None):
    """``body(*tiles)`` inside a kernel on ``target``: host ``arrays`` are DMA'd into SBUF tiles of
    the same shape and dtype; ``body`` returns a tile or a tuple of tiles (PSUM ones are evicted
    through SBUF), which come back as NumPy arrays."""
    @jit
    def kernel(*hbm):
        tiles = []
        for a in hbm:
            t = nl.ndarray(a.shape, a.dtype, buffer=nl.sbuf, name="in")
            nisa.dma_copy(dst=t, src=a)
            tiles.append(t)
        res = body(*tiles)
        outs = []
        for r in (res if isinstance(res, tuple) else (res,)):
            if r.buffer == nl.psum:
                s = nl.ndarray(r.shape, r.dtype, buffer=nl.sbuf, name="evict")
                nisa.tensor_copy(dst=s, src=r)
                r = s
            out = nl.ndarray(r.shape, r.dtype, buffer=nl.shared_hbm, name="out")
            nisa.dma_copy(dst=out, src=r)
            outs.append(out)
        return tuple(outs) if isinstance(res, tuple) else outs[0]
    return simulate.simulate(kernel, target=target)(*arrays)


def events(op):
    """Events of instruction ``op`` in the last launch."""
    return [e for e in simulate.last_trace() if e.op == op]


def sb(shape, dtype=nl.float32, name="t"):
    return nl.ndarray(shape, dtype, buffer=nl.sbuf, name=name)


def ps(shape, dtype=nl.float32, name="p"):
    return nl.ndarray(shape, dtype, buffer=nl.psum, name=name)


def randn(rng, *shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


def copy_through_sbuf(x):
    """Kernel helper: ``x`` copied HBM -> SBUF -> a new shared-HBM output."""
    out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
    t = nl.ndarray(x.shape, x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    nisa.dma_copy(dst=out, src=t)
    return out


def write_then_read_all(tiles):
    """Make every tile live at once (liveness runs from first use to last): write each, then
    read each."""
    from nki_kernels.simulate import nisa, nl
    for t in tiles:
        nisa.memset(dst=t, value=0.0)
    sink = nl.ndarray((128, 1), nl.float32, buffer=nl.sbuf)
    for t in tiles:
        nisa.tensor_copy(dst=sink, src=t[:, 0:1])
