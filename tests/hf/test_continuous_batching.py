"""HF transformers' continuous batching (its cache, scheduler, chunked prefill and prefix sharing)
with every attention layer on our kernels: tokens equal plain ``generate`` and ``paged|eager``,
log-probabilities within tolerance, and each of our paths provably taken."""

import os

import pytest

pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

from nki_kernels import simulate  # noqa: E402
from examples import hf_continuous_batching as example  # noqa: E402

# what each model must exercise: Llama full-attention pages shared by a common prefix; gpt-oss a
# ring that wraps (reads of cached tokens, writes beyond the window dropped) beside full layers
# with sinks; Gemma 2 soft cap on ring and full layers
MUST = {"llama": ("full", "shared_pages"),
        "gpt-oss": ("full", "ring", "cached_reads", "dropped_writes"),
        "gemma2": ("full", "ring", "cached_reads", "dropped_writes")}


@pytest.mark.parametrize("name,target", [("llama", "trn2"), ("gpt-oss", "trn2"),
                                         ("gemma2", "trn2"), ("gpt-oss", "trn1")])
def test_generate_batch_through_our_kernels_matches_transformers(name, target):
    lines = []
    with simulate.use_target(target):
        equal, worst, counts = example.compare(example.tiny_model(name), log=lines.append)
    assert equal, lines
    assert worst <= example.TOLERANCE, lines
    for key in MUST[name]:
        assert counts.get(key, 0) > 0, (key, counts)
    assert counts["queries"] >= sum(map(len, example.PROMPTS))


def test_page_table_larger_than_one_chunk_of_the_scheduler():
    """Long prompts over pages of 4 tokens, a batch budget of 5 tokens: prefill chunks end
    mid-page and the page table spans many pages."""
    prompts = [list(range(1, 40)), list(range(50, 60)), [7]]
    equal, worst, counts = example.compare(example.tiny_model("llama", seed=3), prompts=prompts,
                                           new_tokens=6, page_size=4, batch_tokens=5,
                                           log=lambda line: None)
    assert equal and worst <= example.TOLERANCE
    assert counts["full"] > 0


def test_plain_forward_is_refused_by_name():
    from nki_kernels.hf import IMPLEMENTATION, use_nki_attention
    model = use_nki_attention(example.tiny_model("llama"))
    assert model.config._attn_implementation == IMPLEMENTATION
    with pytest.raises(ValueError, match="continuous batching"):
        model(torch.tensor([[1, 2, 3]]))


def test_registration_needs_a_flash_name():
    from nki_kernels.hf import register
    with pytest.raises(ValueError, match="must contain 'flash'"):
        register("nki_paged")


CHECKPOINT = os.environ.get("NKI_KERNELS_HF_CHECKPOINT", "HuggingFaceTB/SmolLM2-135M")


def test_real_checkpoint_if_cached():
    """A real small checkpoint from the local HF cache (NKI_KERNELS_HF_CHECKPOINT, default
    SmolLM2-135M); skipped when it is not there (no download)."""
    from transformers import AutoModelForCausalLM
    try:
        model = AutoModelForCausalLM.from_pretrained(CHECKPOINT, local_files_only=True,
                                                     dtype=torch.float32).eval()
    except (OSError, ValueError) as e:
        pytest.skip(f"{CHECKPOINT} is not in the local HF cache ({type(e).__name__})")
    equal, worst, _ = example.compare(model, new_tokens=4, page_size=16, batch_tokens=16,
                                      log=lambda line: None)
    assert equal and worst <= 1e-3
