"""Fuzzing the simulator with instructions of random operands, legal or not, on trn1 and trn2: an
instruction either runs or raises a ``SimulationError`` subclass naming the instruction and the
kernel line. A NumPy or Python error escaping (IndexError, ValueError, TypeError, ...) is what a
kernel author would see instead of the rule they broke: never acceptable for user input."""

import numpy as np
import pytest
from hypothesis import event
from hypothesis import strategies as st

from nki_kernels import simulate
from nki_kernels.simulate import jit, nisa, nl

from .cases import BUDGETS, TARGETS, run

DTYPES = {"float32": nl.float32, "bfloat16": nl.bfloat16, "float16": nl.float16,
          "int32": nl.int32, "uint8": nl.uint8, "float8_e4m3": nl.float8_e4m3}
BUFFERS = ("sbuf", "sbuf", "psum", "hbm")

# instruction -> (operand roles, keyword arguments as strategies)
INSTRUCTIONS = {
    "tensor_tensor": (("dst", "data1", "data2"),
                      dict(op=st.sampled_from([nl.add, nl.multiply, nl.maximum, nl.exp,
                                               nl.bitwise_and]))),
    "tensor_scalar": (("dst", "data"),
                      dict(op0=st.sampled_from([nl.multiply, nl.subtract, nl.exp]),
                           operand0=st.sampled_from([2.0, 0, -1.5, "x"]))),
    "activation": (("dst", "data"),
                   dict(op=st.sampled_from([nl.exp, nl.copy, nl.gelu, nl.add]),
                        scale=st.sampled_from([1.0, 0.5, "bias"]))),
    "tensor_copy": (("dst", "src"), {}),
    "reciprocal": (("dst", "data"), {}),
    "tensor_reduce": (("dst", "data"),
                      dict(op=st.sampled_from([nl.add, nl.maximum, nl.exp]),
                           axis=st.sampled_from([1, (1,), 0, 2, -1]))),
    "nc_matmul": (("dst", "stationary", "moving"), {}),
    "nc_transpose": (("dst", "data"), {}),
    "dma_copy": (("dst", "src"), {}),
    "memset": (("dst",), dict(value=st.sampled_from([0.0, 1, -3.5]))),
    "tensor_partition_reduce": (("dst", "data"), dict(op=st.sampled_from([nl.add, nl.maximum]))),
    "bn_stats": (("dst", "data"), {}),
    "bn_aggr": (("dst", "data"), {}),
    "max8": (("dst", "src"), {}),
    "nc_find_index8": (("dst", "data", "vals"), {}),
    "scalar_tensor_tensor": (("dst", "data", "operand1"),
                             dict(op0=st.sampled_from([nl.multiply, nl.add]),
                                  operand0=st.sampled_from([1.5, "x"]),
                                  op1=st.sampled_from([nl.add, nl.maximum, nl.exp]))),
    "tensor_tensor_scan": (("dst", "data0", "data1"),
                           dict(initial=st.sampled_from([0.0, "x"]),
                                op0=st.sampled_from([nl.multiply, nl.add]),
                                op1=st.sampled_from([nl.add, nl.maximum]))),
    "tensor_copy_predicated": (("dst", "src", "predicate"), {}),
    "exponential": (("dst", "src"), dict(max_value=st.sampled_from([0.0, 2.0, "x"]))),
    "activation_reduce": (("dst", "data", "reduce_res"),
                          dict(op=st.sampled_from([nl.exp, nl.copy]),
                               reduce_op=st.sampled_from([nl.add, nl.maximum, nl.exp]))),
    "dma_transpose": (("dst", "src"), {}),
    "select_reduce": (("dst", "predicate", "on_true"),
                      dict(on_false=st.sampled_from([0.0, -1.0, "x"]))),
    "iota": (("dst",), dict(pattern=st.sampled_from([[[1, 4]], [[0, 1], [2, 8]], [[1, 3]]]),
                            channel_multiplier=st.sampled_from([0, 1, -2]))),
}


@st.composite
def operands(draw):
    """(buffer, dtype name, shape, view) of one operand; ``view``: a slice applied to it."""
    buffer = draw(st.sampled_from(BUFFERS))
    dtype = draw(st.sampled_from(sorted(DTYPES)))
    parts = draw(st.sampled_from([1, 3, 32, 64, 128, 129]))
    free = draw(st.sampled_from([1, 5, 32, 128, 512, 2049, 100000]))
    shape = (parts, free) if draw(st.booleans()) else (parts, 2, max(1, free // 2))
    view = draw(st.sampled_from(["whole", "whole", "head", "stride", "partition 32"]))
    return buffer, dtype, shape, view


@st.composite
def instruction_calls(draw):
    name = draw(st.sampled_from(sorted(INSTRUCTIONS)))
    roles, kwargs = INSTRUCTIONS[name]
    ops = {role: draw(operands()) for role in roles}
    if draw(st.booleans()):          # half the calls: every operand the shape of the first
        first = ops[roles[0]]
        ops = {role: (b, d, first[2], first[3]) for role, (b, d, _, _) in ops.items()}
    if draw(st.booleans()):          # half of those: the buffers the instruction documents
        psum_dst = name in ("nc_matmul", "nc_transpose")
        ops = {role: ("psum" if role == "dst" and psum_dst else
                      "hbm" if name == "dma_copy" and role == "dst" else "sbuf", d, shape, v)
               for role, (_, d, shape, v) in ops.items()}
    args = {k: draw(s) for k, s in kwargs.items()}
    return dict(name=name, operands=ops, kwargs=args,
                target=draw(st.sampled_from(TARGETS + ("trn3",))))


def _make(buffer, dtype, shape, view, hbm_in):
    dt = DTYPES[dtype]
    if buffer == "hbm":
        t = nl.ndarray(shape, dt, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=t, src=hbm_in[:shape[0]] if hbm_in.shape == shape else t)
    else:
        t = nl.ndarray(shape, dt, buffer=nl.sbuf if buffer == "sbuf" else nl.psum)
        nisa.memset(dst=t, value=1)
    if view == "head":
        return t[0:max(1, shape[0] // 2)]
    if view == "stride" and len(shape) == 2:
        return t[:, ::2]
    if view == "partition 32" and shape[0] > 32:
        return t[32:shape[0]]
    return t


def _kernel(call):
    name, specs, kwargs = call["name"], call["operands"], dict(call["kwargs"])
    instruction = getattr(nisa, name)

    @jit
    def kernel(x):
        made = {}
        for role, (buffer, dtype, shape, view) in specs.items():
            made[role] = _make(buffer, dtype, shape, view, x)
        extra = dict(kwargs)
        for key in ("operand0", "initial", "max_value", "on_false", "scale"):
            if extra.get(key) in ("x", "bias"):       # a tile operand in that place
                extra[key] = made[list(made)[-1]]
        instruction(**made, **extra)
        return x
    return kernel


@pytest.mark.parametrize("budget", BUDGETS)
def test_an_instruction_runs_or_raises_a_simulation_error_naming_it(budget):
    def prop(call):
        x = np.ones((1, 1), np.float32)
        try:
            with simulate.use_target(call["target"]):
                simulate.simulate(_kernel(call))(x)
            event(f"{call['name']}: ran")
        except simulate.SimulationError as err:
            event(f"{call['name']}: {type(err).__name__}")
            assert err.op, f"{type(err).__name__} names no instruction: {err}"
            assert err.location and "test_fuzz_isa.py" in err.location, \
                f"{type(err).__name__} names no kernel line: {err}"
    run(prop, instruction_calls(), 250, budget)
