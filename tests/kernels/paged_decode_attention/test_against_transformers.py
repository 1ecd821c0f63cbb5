"""The decode kernel vs HF transformers' eager attention (Llama's eager_attention_forward)."""

from types import SimpleNamespace

import numpy as np
import pytest

from nki_kernels.paged_decode_attention import batch_decode

from .conftest import make_decode_case
from .test_against_onnx import per_request_inputs

torch = pytest.importorskip("torch")
modeling_llama = pytest.importorskip("transformers.models.llama.modeling_llama")


@pytest.mark.parametrize("group", [1, 2, 4])
@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_matches_hf_eager_attention(rng, group, layout):
    page_size, D, H = 16, 32, 2
    args = make_decode_case(rng, [3, 16, 50], page_size, H, group, D, layout=layout, fused=False)
    out = batch_decode(*args)
    module = SimpleNamespace(num_key_value_groups=group, training=False)
    for b in range(3):
        Q, K, V, _ = per_request_inputs(args, b, page_size)
        y, _ = modeling_llama.eager_attention_forward(
            module, torch.from_numpy(np.ascontiguousarray(Q)), torch.from_numpy(K), torch.from_numpy(V),
            None, scaling=D ** -0.5)
        np.testing.assert_allclose(out[b], y[0, 0].numpy(), atol=2e-5, rtol=2e-5)   # y: [1, 1, HQ, D]
