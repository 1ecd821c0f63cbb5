"""A tiny HF Llama generates greedily over the paged cache (chunked prefill, decode, speculative
verification); every step's logits match the model's eager forward."""

import pytest

pytest.importorskip("transformers")
pytest.importorskip("onnxruntime")
torch = pytest.importorskip("torch")


def test_paged_generation_matches_hf_eager_step_by_step(target):
    import examples.llama_paged_decode as example
    lines = []
    worst = example.run(steps=2, chunk=2, drafts=3, log=lines.append)
    assert worst <= example.TOLERANCE, lines
    assert sum("ONNX Runtime (bit for bit)" in line for line in lines) == 1
    # request 0's second draft is corrupted (one accepted), the others are the model's own
    assert any("accepted [1, 2, 3]" in line for line in lines), lines


def test_verify_drops_rejected_drafts_from_the_cache():
    """After a rejection the cache holds exactly the accepted tokens: the next step's logits
    equal the eager forward over the accepted sequence, and whole pages past it are freed."""
    from examples.llama_paged_decode import draft_tokens, eager_logits
    from nki_kernels.torch.llama_paged import PagedLlamaGenerator, tiny_llama
    model = tiny_llama(seed=1)
    gen = PagedLlamaGenerator(model, num_pages=16, page_size=2)
    prompt = [3, 1, 4, 1, 5]
    nxt = int(gen.prefill([prompt], chunk=4)[0].argmax())
    drafts = [(t + 7) % 128 for t in draft_tokens(model, prompt + [nxt], 5, False)]  # all wrong
    free = gen.pages.num_free_pages
    _, gained = gen.verify([nxt], [drafts])
    seq = prompt + [nxt]
    assert gen.pages.seq_len(0) == len(seq) and len(gained[0]) == 1
    assert gen.pages.num_free_pages == free      # 5 and 6 tokens both fill 3 pages of 2
    logits = gen.decode(torch.tensor(gained[0]))
    want = eager_logits(model, seq + gained[0], 1)[0]
    assert float((logits[0] - want).abs().max()) <= 1e-4
