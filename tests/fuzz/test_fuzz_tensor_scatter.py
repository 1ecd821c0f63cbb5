"""Property-based fuzzing of ONNX TensorScatter-24 (``tensor_scatter_`` in place, ``tensor_scatter``
functional) on trn1 and trn2, against the operator's definition written out row by row: any rank,
any axis but 0, linear or circular, many element types, updates that view the cache."""

import ml_dtypes
import numpy as np
import pytest
from hypothesis import strategies as st

from nki_kernels.tensor_scatter import tensor_scatter, tensor_scatter_

from .cases import (BUDGETS, TARGETS, assert_refused, bits, corrupted, on_target, run,
                    snapshot, unchanged)

DTYPES = (np.float32, np.float16, ml_dtypes.bfloat16, np.int8, np.uint16, np.int64, np.bool_,
          np.complex64, ml_dtypes.float8_e5m2)


def definition(past, update, w, axis, mode):
    """present[b, ..., idx(s), ...] = update[b, ..., s, ...] with idx(s) = w[b] + s (mod the
    maximum length when circular); every other element of past_cache kept."""
    out = past.copy()
    max_seq = past.shape[axis]
    for b in range(past.shape[0]):
        for s in range(update.shape[axis]):
            idx = (w[b] + s) % max_seq if mode == "circular" else w[b] + s
            dst = [b] + [slice(None)] * (past.ndim - 1)
            src = list(dst)
            dst[axis], src[axis] = idx, s
            out[tuple(dst)] = update[tuple(src)]
    return out


@st.composite
def scatter_cases(draw):
    rank = draw(st.integers(2, 4))
    shape = [draw(st.integers(1, 4))] + [draw(st.integers(1, 5)) for _ in range(rank - 1)]
    axis = draw(st.integers(1, rank - 1))
    shape[axis] = max_seq = draw(st.one_of(st.integers(1, 12), st.sampled_from([129, 200])))
    seq_len = draw(st.integers(0, max_seq))
    mode = draw(st.sampled_from(["linear", "circular"]))
    B = shape[0]
    if mode == "linear":
        w = [draw(st.integers(0, max_seq - seq_len)) for _ in range(B)]
    else:
        w = [draw(st.integers(0, 3 * max_seq)) for _ in range(B)]
    dtype = draw(st.sampled_from(DTYPES))
    rng = np.random.default_rng(draw(st.integers(0, 2**31 - 1)))
    raw = rng.integers(0, 256, size=int(np.prod(shape)) * np.dtype(dtype).itemsize, dtype=np.uint8)
    past = raw.view(dtype).reshape(shape).copy()
    if dtype == np.bool_:
        past = past.view(np.uint8) % 2 == 1
    ushape = list(shape)
    ushape[axis] = seq_len
    aliased = draw(st.booleans()) and seq_len > 0
    if aliased:              # the update views past_cache (rows the scatter may overwrite)
        index = [slice(None)] * rank
        start = draw(st.integers(0, max_seq - seq_len))
        index[axis] = slice(start, start + seq_len)
        update = past[tuple(index)]
    else:
        update = past[tuple(slice(0, n) for n in ushape)].copy()[::-1].copy() \
            if seq_len else np.zeros(ushape, past.dtype)
    none_indices = draw(st.booleans()) and not any(w)
    return dict(past=past, update=update, w=np.array(w, np.int64), axis=axis, mode=mode,
                negative_axis=draw(st.booleans()), none_indices=none_indices, aliased=aliased,
                target=draw(st.sampled_from(TARGETS)))


def _call_args(c):
    axis = c["axis"] - c["past"].ndim if c["negative_axis"] else c["axis"]
    return (c["past"], c["update"], None if c["none_indices"] else c["w"], axis, c["mode"])


@pytest.mark.parametrize("budget", BUDGETS)
def test_in_place_scatter_equals_the_definition(budget):
    def prop(c):
        want = definition(c["past"], c["update"].copy(), c["w"], c["axis"], c["mode"])
        with on_target(c):
            tensor_scatter_(*_call_args(c))
        assert np.array_equal(bits(c["past"]), bits(want)), \
            "aliased update" if c["aliased"] else "past_cache differs from the definition"
    run(prop, scatter_cases(), 80, budget)


@pytest.mark.parametrize("budget", BUDGETS)
def test_functional_scatter_leaves_its_inputs_alone(budget):
    def prop(c):
        snap = snapshot(c["past"], c["update"], c["w"])
        want = definition(c["past"], c["update"].copy(), c["w"], c["axis"], c["mode"])
        with on_target(c):
            got = tensor_scatter(*_call_args(c))
        assert got.dtype == c["past"].dtype and np.array_equal(bits(got), bits(want))
        assert unchanged(snap)
    run(prop, scatter_cases(), 40, budget)


def corrupt(c, kind):
    past, axis, max_seq = c["past"], c["axis"], c["past"].shape[c["axis"]]
    seq_len = c["update"].shape[axis]
    c["none_indices"] = False
    if kind == "axis 0":
        c["axis"], c["negative_axis"] = 0, False
        return "axis"
    if kind == "linear write past the end" and seq_len > 0:
        c["mode"] = "linear"
        c["w"] = c["w"].copy()
        c["w"][-1] = max_seq - seq_len + 1
        return "write_indices"
    if kind == "negative index":
        c["w"] = c["w"].copy()
        c["w"][0] = -1
        return "write_indices"
    if kind == "int32 indices":
        c["w"] = c["w"].astype(np.int32)
        return "write_indices"
    if kind == "indices per batch missing" and past.shape[0] > 1:
        c["w"] = c["w"][:-1]
        return "write_indices"
    if kind == "update dtype differs" and past.dtype != np.float64:
        c["update"] = np.zeros(c["update"].shape, np.float64)
        return "update dtype"
    if kind == "update longer than the cache":
        shape = list(c["update"].shape)
        shape[axis] = max_seq + 1
        c["update"] = np.zeros(shape, past.dtype)
        return "exceeds max_sequence_length"
    if kind == "update shape differs off the axis":
        shape = list(c["update"].shape)
        other = next(d for d in range(1, past.ndim + 1) if d != axis) % past.ndim
        shape[other] += 1
        c["update"] = np.zeros(shape, past.dtype)
        return "update shape"
    if kind == "read-only cache":
        past.flags.writeable = False
        return "past_cache"
    if kind == "strided cache" and past.shape[0] > 1:
        c["past"] = np.repeat(past, 2, axis=0)[::2]
        return "past_cache"
    if kind == "unknown mode":
        c["mode"] = "wrap"
        return "mode"
    return None


KINDS = ["axis 0", "linear write past the end", "negative index", "int32 indices",
         "indices per batch missing", "update dtype differs", "update longer than the cache",
         "update shape differs off the axis", "read-only cache", "strided cache", "unknown mode"]


def _no_alias(cases):
    """Cases whose update does not view past_cache (a corruption of one would show in the
    other)."""
    return cases.map(lambda c: dict(c, update=c["update"].copy(), aliased=False))


@pytest.mark.parametrize("budget", BUDGETS)
def test_invalid_scatter_is_refused_by_name_and_writes_nothing(budget):
    def prop(c):
        args = _call_args(c)
        assert_refused(c, lambda: tensor_scatter_(*args), *args[:3])
    run(prop, corrupted(_no_alias(scatter_cases()), corrupt, KINDS,
                        lambda c: dict(c, past=c["past"].copy())), 60, budget)
