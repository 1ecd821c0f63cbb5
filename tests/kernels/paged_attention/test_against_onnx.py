"""The decode kernel vs the ONNX Attention operator (onnx reference evaluator, ONNX Runtime), one
request at a time over the request's gathered K/V."""

import numpy as np
import pytest

from nki_kernels.paged_attention import batch_decode
from nki_kernels.paged_attention.reference import gather_kv

from .conftest import make_decode_case

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402


def attention_model(hq, hkv, L, D, scale, softcap, opset=23):
    f = TensorProto.FLOAT
    inputs = [helper.make_tensor_value_info("Q", f, (1, hq, 1, D)),
              helper.make_tensor_value_info("K", f, (1, hkv, L, D)),
              helper.make_tensor_value_info("V", f, (1, hkv, L, D))]
    attrs = dict(scale=float(scale))
    if softcap:
        attrs["softcap"] = float(softcap)
    node = helper.make_node("Attention", ["Q", "K", "V"], ["Y"], **attrs)
    graph = helper.make_graph([node], "attn", inputs, [helper.make_tensor_value_info("Y", f, (1, hq, 1, D))])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)


def per_request_inputs(args, b, page_size):
    q, cache, ptr, idx, last, layout = args
    L = int((ptr[b + 1] - ptr[b] - 1) * page_size + last[b])
    k, v = gather_kv(cache, ptr, idx, L, b, page_size, layout)        # [L, H, D] float64
    to4 = lambda a: a.transpose(1, 0, 2)[None].astype(np.float32)      # noqa: E731  [1, H, L, D]
    return q[b][None, :, None, :], to4(k), to4(v), L


@pytest.mark.parametrize("runner", ["reference", "onnxruntime"])
@pytest.mark.parametrize("softcap", [0.0, 3.0])
@pytest.mark.parametrize("group", [1, 4])
def test_matches_onnx_attention(rng, target, runner, softcap, group):
    page_size, D, H = 8, 16, 2
    args = make_decode_case(rng, [1, 19, 40], page_size, H, group, D, layout="HND")
    scale = 0.25
    out = batch_decode(*args, sm_scale=scale, logits_soft_cap=softcap)
    for b in range(3):
        Q, K, V, L = per_request_inputs(args, b, page_size)
        model = attention_model(H * group, H, L, D, scale, softcap)
        feeds = {"Q": Q, "K": K, "V": V}
        if runner == "reference":
            y = ReferenceEvaluator(model).run(None, feeds)[0]
        else:
            ort = pytest.importorskip("onnxruntime")
            sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
            y = sess.run(None, feeds)[0]
        np.testing.assert_allclose(out[b], y[0, :, 0, :], atol=2e-5, rtol=2e-5)
