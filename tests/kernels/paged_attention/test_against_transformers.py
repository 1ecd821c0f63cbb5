"""The decode kernel vs HF transformers' eager attention (Llama's eager_attention_forward)."""

from types import SimpleNamespace

import numpy as np
import pytest

from nki_kernels.paged_attention import batch_decode

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


@pytest.mark.parametrize("group", [1, 4])
@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_prefill_matches_hf_eager_attention_with_causal_mask(rng, target, group, layout):
    """batch_prefill (causal) vs eager attention with the additive causal mask a model builds for
    a chunk of n new tokens after L - n cached ones: query i sees keys <= L - n + i."""
    from nki_kernels.paged_attention import batch_prefill
    from nki_kernels.paged_attention.reference import gather_kv

    from .test_prefill import make_prefill_case
    page_size, D, H = 16, 32, 2
    q_lens, kv_lens = [5, 1, 33], [5, 20, 70]
    q, cache, qo_indptr, kv_indptr, kv_indices, last, layout = args = make_prefill_case(
        rng, q_lens, kv_lens, page_size, H, group, D, layout=layout, fused=False)
    out = batch_prefill(*args, causal=True)
    module = SimpleNamespace(num_key_value_groups=group, training=False)
    for b, (n, L) in enumerate(zip(q_lens, kv_lens)):
        k, v = gather_kv(cache, kv_indptr, kv_indices, L, b, page_size, layout)
        to4 = lambda a: torch.from_numpy(np.ascontiguousarray(  # noqa: E731  [1, H, S, D]
            a.transpose(1, 0, 2)[None], np.float32))
        rows = q[qo_indptr[b]:qo_indptr[b + 1]]
        seen = np.arange(L)[None, :] <= (L - n + np.arange(n))[:, None]
        mask = torch.from_numpy(np.where(seen, 0.0, np.finfo(np.float32).min)[None, None]
                                .astype(np.float32))                         # [1, 1, n, L]
        y, _ = modeling_llama.eager_attention_forward(module, to4(rows), to4(k), to4(v), mask,
                                                      scaling=D ** -0.5)
        np.testing.assert_allclose(out[qo_indptr[b]:qo_indptr[b + 1]], y[0].numpy(), atol=2e-5,
                                   rtol=2e-5)                                # y: [1, n, HQ, D]
