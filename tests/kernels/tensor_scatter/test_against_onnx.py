"""TensorScatter kernel vs the onnx reference evaluator, ONNX Runtime and ONNX's own node cases."""

import numpy as np
import pytest

from nki_kernels.tensor_scatter import tensor_scatter

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402

ELEM = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.float16): TensorProto.FLOAT16,
        np.dtype(np.int8): TensorProto.INT8, np.dtype(np.int32): TensorProto.INT32,
        np.dtype(np.int64): TensorProto.INT64, np.dtype(np.uint8): TensorProto.UINT8,
        np.dtype(np.float64): TensorProto.DOUBLE}


def model(cache, update, axis, mode, with_indices=True):
    et = ELEM[cache.dtype]
    inputs = [helper.make_tensor_value_info("past_cache", et, cache.shape),
              helper.make_tensor_value_info("update", et, update.shape)]
    names = ["past_cache", "update"]
    if with_indices:
        inputs.append(helper.make_tensor_value_info("write_indices", TensorProto.INT64, (cache.shape[0],)))
        names.append("write_indices")
    node = helper.make_node("TensorScatter", names, ["present_cache"], axis=axis, mode=mode)
    graph = helper.make_graph([node], "ts", inputs,
                              [helper.make_tensor_value_info("present_cache", et, cache.shape)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 24)], ir_version=10)


GRID = [((2, 1, 4, 5), -2, 2), ((5, 4, 1), 1, 3), ((3, 2, 7, 3), 2, 7), ((2, 3, 2, 5, 2), 3, 4),
        ((4, 6, 3), -2, 5), ((2, 3, 4), -1, 2)]


def inputs(rng, shape, axis, seq_len, mode, dtype):
    cache = (rng.standard_normal(shape) * 10).astype(dtype)
    us = list(shape)
    us[axis] = seq_len
    update = (rng.standard_normal(us) * 10).astype(dtype)
    max_seq = shape[axis]
    w = rng.integers(0, max_seq - seq_len + 1 if mode == "linear" else max_seq, size=shape[0])
    return cache, update, w.astype(np.int64)


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int8, np.int64])
@pytest.mark.parametrize("mode", ["linear", "circular"])
@pytest.mark.parametrize("shape, axis, seq_len", GRID, ids=str)
def test_matches_onnx_reference_evaluator(rng, target, shape, axis, seq_len, mode, dtype):
    cache, update, w = inputs(rng, shape, axis, seq_len, mode, dtype)
    expected = ReferenceEvaluator(model(cache, update, axis, mode)).run(
        None, {"past_cache": cache, "update": update, "write_indices": w})[0]
    np.testing.assert_array_equal(tensor_scatter(cache, update, w, axis, mode), expected)


def test_batch_beyond_max_seq_circular_case(target):
    # onnx < 1.23 wrapped the batch coordinate too; the fixed reference and we do not.
    cache, update = np.zeros((5, 4, 1), np.float32), np.arange(5, dtype=np.float32).reshape(5, 1, 1) + 1
    w = np.array([0, 1, 2, 3, 3], np.int64)
    expected = ReferenceEvaluator(model(cache, update, 1, "circular")).run(
        None, {"past_cache": cache, "update": update, "write_indices": w})[0]
    out = tensor_scatter(cache, update, w, 1, "circular")
    np.testing.assert_array_equal(out, expected)
    assert out[4, 3, 0] == 5 and out[0, 0, 0] == 1


def test_omitted_write_indices(rng):
    cache, update, _ = inputs(rng, (2, 1, 4, 5), -2, 2, "linear", np.float32)
    expected = ReferenceEvaluator(model(cache, update, -2, "linear", with_indices=False)).run(
        None, {"past_cache": cache, "update": update})[0]
    np.testing.assert_array_equal(tensor_scatter(cache, update, None), expected)


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int8, np.uint8, np.float64])
@pytest.mark.parametrize("mode", ["linear", "circular"])
@pytest.mark.parametrize("shape, axis, seq_len", GRID, ids=str)
def test_matches_onnxruntime(rng, target, shape, axis, seq_len, mode, dtype):
    ort = pytest.importorskip("onnxruntime")
    cache, update, w = inputs(rng, shape, axis, seq_len, mode, dtype)
    sess = ort.InferenceSession(model(cache, update, axis, mode).SerializeToString(),
                                providers=["CPUExecutionProvider"])
    expected = sess.run(None, {"past_cache": cache, "update": update, "write_indices": w})[0]
    np.testing.assert_array_equal(tensor_scatter(cache, update, w, axis, mode), expected)


def test_onnx_backend_node_cases(target):
    from onnx.backend.test.case.node import collect_testcases
    cases = [c for c in collect_testcases("TensorScatter")]
    assert len(cases) >= 3
    for case in cases:
        node = case.model.graph.node[0]
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        mode = attrs.get("mode", b"linear")
        mode = mode.decode() if isinstance(mode, bytes) else mode
        for inputs_, outputs in case.data_sets:
            w = inputs_[2] if len(inputs_) > 2 else None
            out = tensor_scatter(inputs_[0], inputs_[1], w, attrs.get("axis", -2), mode)
            np.testing.assert_array_equal(out, outputs[0], err_msg=case.name)
