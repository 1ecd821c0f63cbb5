"""The simulator's nki.jit books: one compilation per (shapes, dtypes, non-tensor args) key, and a
refusal when one key issues two different programs."""

import numpy as np
import pytest

from nki_kernels import simulate
from nki_kernels.simulate import jit, nisa, nl


@jit
def scale_rows(x, factor):
    out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
    t = nl.ndarray(x.shape, x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    nisa.tensor_scalar(dst=t, data=t, op0=nl.multiply, operand0=factor)
    nisa.dma_copy(dst=out, src=t)
    return out


def test_keys_are_shapes_dtypes_and_non_tensor_values():
    simulate.reset_compile_stats()
    x = np.ones((4, 8), np.float32)
    scale_rows(x, 2.0)
    scale_rows(x * 5, 2.0)                         # same key: new data only
    scale_rows(x, 3.0)                             # a non-tensor argument is part of the key
    scale_rows(np.ones((4, 9), np.float32), 2.0)   # shape
    scale_rows(x.astype(np.float16), 2.0)          # dtype
    scale_rows(x, 2.0)
    assert simulate.compile_stats(scale_rows) == {"kernel": "scale_rows", "compilations": 4,
                                                  "hits": 2}
    assert len(simulate.compile_keys(scale_rows)) == 4
    assert simulate.last_trace().compiled is False
    simulate.reset_compile_stats()
    assert simulate.compile_stats(scale_rows)["compilations"] == 0


def test_target_and_grid_join_the_key():
    simulate.reset_compile_stats()
    x = np.ones((2, 2), np.float32)
    simulate.simulate(scale_rows, target="trn1")(x, 1.0)
    simulate.simulate(scale_rows, target="trn2")(x, 1.0)
    simulate.simulate(scale_rows[2], target="trn2")(x, 1.0)
    assert simulate.compile_stats(scale_rows)["compilations"] == 3


_mode = {"double": False}


@jit
def reads_a_host_global(x):
    out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
    t = nl.ndarray(x.shape, x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    if _mode["double"]:                        # not in the compile key
        nisa.tensor_tensor(dst=t, data1=t, data2=t, op=nl.add)
    nisa.dma_copy(dst=out, src=t)
    return out


def test_a_program_that_depends_on_something_outside_the_key_is_refused():
    simulate.reset_compile_stats()
    x = np.ones((2, 2), np.float32)
    reads_a_host_global(x)
    _mode["double"] = True
    try:
        with pytest.raises(simulate.CompileKeyError, match="same compile key issued different"):
            reads_a_host_global(x)
    finally:
        _mode["double"] = False


def test_device_loop_trip_counts_do_not_change_the_program():
    @jit
    def copy_first_n(x, n):
        out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
        nb = nl.ndarray((1, 1), nl.int32, buffer=nl.sbuf)
        nisa.dma_copy(dst=nb, src=n)
        reg = nisa.register_alloc()
        nisa.register_load(reg, nb)
        row = nl.ndarray((1, x.shape[1]), x.dtype, buffer=nl.sbuf)

        def body(i):
            nisa.dma_copy(dst=row, src=x.ap([[x.shape[1], 1], [1, x.shape[1]]], scalar_offset=i))
            nisa.dma_copy(dst=out.ap([[x.shape[1], 1], [1, x.shape[1]]], scalar_offset=i), src=row)
        nl.fori_loop(0, reg, body)
        return out
    simulate.reset_compile_stats()
    x = np.arange(12, dtype=np.float32).reshape(4, 3)
    for n in (0, 1, 4, 2):
        out = copy_first_n(x, np.array([[n]], np.int32))
        np.testing.assert_array_equal(out[:n], x[:n])
        assert len(simulate.last_trace()) == 1 + 2 * n
    assert simulate.compile_stats(copy_first_n) == {"kernel": copy_first_n.__qualname__,
                                                    "compilations": 1, "hits": 3}
