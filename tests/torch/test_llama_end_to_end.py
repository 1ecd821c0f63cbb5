"""A tiny HF Llama decodes greedily over the paged cache; logits match the model's eager forward."""

import pytest

pytest.importorskip("transformers")
pytest.importorskip("onnxruntime")


def test_paged_decode_matches_hf_eager_step_by_step(target):
    import examples.llama_paged_decode as example
    lines = []
    worst = example.run(steps=2, log=lines.append)
    assert worst <= example.TOLERANCE, lines
    assert sum("ONNX Runtime (bit for bit)" in line for line in lines) == 2
