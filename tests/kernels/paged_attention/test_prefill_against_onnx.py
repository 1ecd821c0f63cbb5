"""batch_prefill vs the ONNX Attention operator (onnx reference evaluator, ONNX Runtime) with
is_causal and past K/V: each request's cached tokens are past_key/past_value, its new tokens K/V,
one request at a time (ONNX's causal mask with a past is bottom-right aligned, as FlashInfer's)."""

import numpy as np
import pytest

from nki_kernels.paged_attention import batch_prefill
from nki_kernels.paged_attention.reference import gather_kv

from .test_prefill import make_prefill_case

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402


def causal_attention_model(hq, hkv, n, past, D, scale, softcap, opset=23):
    f = TensorProto.FLOAT
    names = [("Q", hq, n), ("K", hkv, n), ("V", hkv, n), ("past_key", hkv, past),
             ("past_value", hkv, past)]
    inputs = [helper.make_tensor_value_info(name, f, (1, h, s, D)) for name, h, s in names]
    attrs = dict(scale=float(scale), is_causal=1)
    if softcap:
        attrs["softcap"] = float(softcap)
    # the 4th input, attn_mask, is absent; ONNX Runtime wants the present K/V out with a past
    node = helper.make_node("Attention", ["Q", "K", "V", "", "past_key", "past_value"],
                            ["Y", "present_key", "present_value"], **attrs)
    outs = [helper.make_tensor_value_info("Y", f, (1, hq, n, D))] + [
        helper.make_tensor_value_info(name, f, (1, hkv, past + n, D))
        for name in ("present_key", "present_value")]
    graph = helper.make_graph([node], "causal_attention", inputs, outs)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)


def run(model, feeds, runner):
    if runner == "reference":
        return ReferenceEvaluator(model).run(None, feeds)[0]
    ort = pytest.importorskip("onnxruntime")
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)[0]


@pytest.mark.parametrize("runner", ["reference", "onnxruntime"])
@pytest.mark.parametrize("softcap", [0.0, 3.0])
@pytest.mark.parametrize("group", [1, 4])
def test_matches_onnx_causal_attention_with_past(rng, target, runner, softcap, group):
    page_size, D, H, scale = 8, 16, 2, 0.25
    q_lens, kv_lens = [1, 4, 19, 3], [9, 4, 40, 130]
    args = make_prefill_case(rng, q_lens, kv_lens, page_size, H, group, D, layout="HND")
    q, cache, qo_indptr, kv_indptr, kv_indices, last, layout = args
    out = batch_prefill(*args, causal=True, sm_scale=scale, logits_soft_cap=softcap)
    for b, (n, L) in enumerate(zip(q_lens, kv_lens)):
        k, v = gather_kv(cache, kv_indptr, kv_indices, L, b, page_size, layout)    # [L, H, D]
        to4 = lambda a: np.ascontiguousarray(a.transpose(1, 0, 2)[None], np.float32)  # noqa: E731
        rows = q[qo_indptr[b]:qo_indptr[b + 1]]                                       # [n, HQ, D]
        feeds = {"Q": to4(rows), "K": to4(k[L - n:]), "V": to4(v[L - n:]),
                 "past_key": to4(k[:L - n]), "past_value": to4(v[:L - n])}
        y = run(causal_attention_model(H * group, H, n, L - n, D, scale, softcap), feeds, runner)
        np.testing.assert_allclose(out[qo_indptr[b]:qo_indptr[b + 1]], y[0].transpose(1, 0, 2),
                                   atol=2e-5, rtol=2e-5)
