"""Tensors placed with ``address=``: the same address means the same memory, counted once."""

import numpy as np
import pytest

from nki_kernels.simulate import jit, nisa, nl
from nki_kernels.simulate.errors import CapacityError

from .isa_util import write_then_read_all

BANK = 2048


def _rotating_banks_kernel(n_tiles, banks):
    @jit
    def k(x):
        out = nl.ndarray((128, n_tiles), nl.float32, buffer=nl.shared_hbm)
        src = nl.ndarray((128, 1), nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=src, src=x)
        tiles = []                                   # every tile stays referenced
        for i in range(n_tiles):
            t = nl.ndarray((128, 512), nl.float32, buffer=nl.psum,
                           address=(0, (i % banks) * BANK))
            nisa.tensor_scalar(dst=t[:, 0:1], data=src, op0=nl.add, operand0=float(i))
            tiles.append(t)
        res = nl.ndarray((128, n_tiles), nl.float32, buffer=nl.sbuf)
        for i in range(len(tiles)):
            nisa.tensor_copy(dst=res[:, i:i + 1], src=tiles[i][:, 0:1])
        nisa.dma_copy(dst=out, src=res)
        return out
    return k


def test_rotating_placed_banks_are_not_a_capacity_error_and_share_storage():
    x = np.arange(128, dtype=np.float32).reshape(128, 1)
    got = _rotating_banks_kernel(24, 8)(x)
    # tiles i, i+8, i+16 are one bank: each reads the last value written there
    last = [max(j for j in range(24) if j % 8 == i % 8) for i in range(24)]
    np.testing.assert_array_equal(got, x + np.array(last, np.float32)[None, :])


def test_unplaced_tiles_live_at_once_do_exceed_the_banks():
    @jit
    def k(x):
        tiles = [nl.ndarray((128, 512), nl.float32, buffer=nl.psum) for _ in range(9)]
        write_then_read_all(tiles)
        return x
    with pytest.raises(CapacityError, match="8 of 8 banks live"):
        k(np.zeros((1, 1), np.float32))


@pytest.mark.parametrize("unplaced, fits", [(2, True), (3, False)])
def test_placed_regions_and_allocator_tensors_share_the_banks(unplaced, fits):
    @jit
    def k(x):
        placed = [nl.ndarray((128, 512), nl.float32, buffer=nl.psum, address=(0, b * BANK))
                  for b in range(6)]
        again = nl.ndarray((128, 512), nl.float32, buffer=nl.psum, address=(0, 0))
        free = [nl.ndarray((128, 512), nl.float32, buffer=nl.psum) for _ in range(unplaced)]
        write_then_read_all(free)
        return len(placed + [again] + free)
    if fits:                                       # six placed banks (one used twice) + two
        assert k(np.zeros((1, 1), np.float32)) == 9
    else:
        with pytest.raises(CapacityError, match="8 of 8 banks live"):
            k(np.zeros((1, 1), np.float32))


def test_partly_overlapping_placements_share_their_common_bytes_both_ways():
    """As on the device: what one tile writes into the shared bytes the other reads, whichever
    was placed first, and the bytes outside the overlap stay each tile's own."""
    @jit
    def k(x):
        a = nl.ndarray((8, 16), nl.float32, buffer=nl.sbuf, address=(0, 1024))
        nisa.memset(dst=a, value=-1.0)
        # b: partitions 4..11, bytes 1024 + 32 .. 1024 + 96 (a's columns 8..15 and 8 more)
        b = nl.ndarray((8, 16), nl.float32, buffer=nl.sbuf, address=(4, 1024 + 32))
        nisa.memset(dst=b, value=5.0)
        nisa.dma_copy(dst=a, src=x)                   # a after b: the overlap is x's again
        seen_by_b = nl.ndarray((8, 16), nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=seen_by_b, src=b)
        nisa.memset(dst=b[0:4, 0:8], value=7.0)       # b's part of the overlap
        seen_by_a = nl.ndarray((8, 16), nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=seen_by_a, src=a)
        return seen_by_b, seen_by_a
    x = np.arange(8 * 16, dtype=np.float32).reshape(8, 16)
    by_b, by_a = k(x)
    np.testing.assert_array_equal(by_b[0:4, 0:8], x[4:8, 8:16])     # a's write, read through b
    np.testing.assert_array_equal(by_b[4:8], 5.0)                    # b's own rows
    np.testing.assert_array_equal(by_b[0:4, 8:16], 5.0)
    want = x.copy()
    want[4:8, 8:16] = 7.0                                            # b's write, read through a
    np.testing.assert_array_equal(by_a, want)


def test_taken_over_regions_are_counted_once():
    """Rotating differently shaped PSUM tiles over the same banks never runs out of banks."""
    @jit
    def k(x):
        src = nl.ndarray((128, 1), nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=src, src=x)
        for i in range(40):
            cols = 512 if i % 2 else 256
            t = nl.ndarray((128, cols), nl.float32, buffer=nl.psum, address=(0, (i % 3) * BANK))
            nisa.tensor_scalar(dst=t[:, 0:1], data=src, op0=nl.add, operand0=float(i))
        out = nl.ndarray((128, 1), nl.float32, buffer=nl.shared_hbm)
        res = nl.ndarray((128, 1), nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=res, src=t[:, 0:1])
        nisa.dma_copy(dst=out, src=res)
        return out
    np.testing.assert_array_equal(k(np.ones((128, 1), np.float32)), 40.0)


def test_placed_sbuf_tensors_of_other_dtypes_see_the_same_bytes():
    @jit
    def k(x):
        a = nl.ndarray((4, 8), nl.float32, buffer=nl.sbuf, address=(0, 4096))
        nisa.dma_copy(dst=a, src=x)
        b = nl.ndarray((4, 8), nl.int32, buffer=nl.sbuf, address=(0, 4096))
        out = nl.ndarray((4, 8), nl.int32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=b)
        return out
    x = np.linspace(-3, 3, 32, dtype=np.float32).reshape(4, 8)
    np.testing.assert_array_equal(k(x), x.view(np.int32))


def test_a_region_freed_and_placed_again_is_fresh_memory():
    @jit
    def k(x):
        a = nl.ndarray((4, 8), nl.float32, buffer=nl.sbuf, address=(0, 0))
        nisa.dma_copy(dst=a, src=x)
        del a
        b = nl.ndarray((4, 8), nl.float32, buffer=nl.sbuf, address=(0, 0))
        out = nl.ndarray((4, 8), nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=b)
        return out
    assert np.isnan(k(np.ones((4, 8), np.float32))).all()       # uninitialised: sentinel NaN


def test_placement_outside_the_buffer_is_refused():
    @jit
    def k(x):
        return nl.ndarray((128, 512), nl.float32, buffer=nl.psum, address=(0, 8 * BANK))
    with pytest.raises(CapacityError, match="leaves the psum"):
        k(np.zeros((1, 1), np.float32))
