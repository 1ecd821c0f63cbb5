"""HF transformers continuous batching with every attention layer on our kernels (simulator).

    python3 examples/hf_continuous_batching.py                 # tiny Llama, gpt-oss, Gemma 2
    python3 examples/hf_continuous_batching.py --model gpt-oss --target trn1
    python3 examples/hf_continuous_batching.py --checkpoint <local HF model dir or cached name>

Several requests of different lengths run through ``model.generate_batch`` with transformers'
own paged cache (small pages), scheduler (prefill in chunks of ``--batch-tokens`` tokens, mixed
with decode) and prefix sharing; ``use_nki_attention`` routes each layer's cache write and
attention through ``nki_kernels``. The generated tokens are compared with plain ``generate``
(greedy, one request at a time) and with transformers' own ``paged|eager`` continuous batching,
whose log-probabilities ours must match within ``TOLERANCE``.

Models (random tiny weights, float32): Llama (GQA, full attention), gpt-oss (attention sinks,
sliding-window layers on a ring of W tokens interleaved with full ones), Gemma 2 (logit soft cap,
sliding window).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

TOLERANCE = 1e-4           # worst |log-probability| difference against paged|eager
PROMPTS = [[1, 2, 3, 4, 5, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20], [6, 7, 8],
           [30, 31, 32, 33, 34, 35, 36], [1, 2, 3, 4, 5, 9, 10, 11, 12, 40, 41]]
MODELS = ("llama", "gpt-oss", "gemma2")


def tiny_model(name: str, seed: int = 0):
    """A randomly initialised tiny causal LM (float32, eval mode)."""
    import torch
    from transformers import AutoModelForCausalLM, Gemma2Config, GptOssConfig, LlamaConfig

    common = dict(vocab_size=97, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=256)
    if name == "llama":
        config = LlamaConfig(intermediate_size=128, **common)
    elif name == "gpt-oss":
        config = GptOssConfig(intermediate_size=64, head_dim=16, num_local_experts=4,
                              num_experts_per_tok=2, sliding_window=6,
                              layer_types=["sliding_attention", "full_attention"],
                              rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
                              **common)
    elif name == "gemma2":
        config = Gemma2Config(intermediate_size=128, head_dim=16, sliding_window=5,
                              attn_logit_softcapping=5.0, **common)
    else:
        raise ValueError(f"model={name!r} must be one of {MODELS}")
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config).eval()
    if name == "gpt-oss":                       # sinks start at zero; make them matter
        with torch.no_grad():
            for layer in model.model.layers:
                layer.self_attn.sinks.normal_()
    return model


def compare(model, prompts=PROMPTS, new_tokens=12, page_size=4, batch_tokens=8, log=print):
    """Generate through our kernels, transformers' paged|eager and plain generate; returns
    (tokens equal to both, worst log-probability difference, what our implementation did)."""
    import torch
    from transformers import ContinuousBatchingConfig, GenerationConfig

    from nki_kernels.hf import use_nki_attention
    from nki_kernels.hf.attention import counts

    greedy = GenerationConfig(max_new_tokens=new_tokens, do_sample=False, eos_token_id=None,
                              pad_token_id=0)
    batching = ContinuousBatchingConfig(page_size=page_size, max_batch_tokens=batch_tokens,
                                        num_blocks=64, return_logprobs=True)
    with torch.no_grad():
        plain = [model.generate(torch.tensor([p]), generation_config=greedy)[0, len(p):].tolist()
                 for p in prompts]
    original = model.config._attn_implementation
    model.config._attn_implementation = "paged|eager"
    theirs = model.generate_batch(inputs=prompts, generation_config=greedy,
                                  continuous_batching_config=batching)
    use_nki_attention(model)
    counts.clear()
    start = time.perf_counter()
    ours = model.generate_batch(inputs=prompts, generation_config=greedy,
                                continuous_batching_config=batching)
    seconds = time.perf_counter() - start
    model.config._attn_implementation = original
    equal, worst = True, 0.0
    for i, key in enumerate(sorted(ours, key=lambda k: int(k.split("_")[-1]))):
        mine, eager = ours[key].generated_tokens, theirs[key].generated_tokens
        diff = float(np.abs(np.subtract(ours[key].logprobs, theirs[key].logprobs)).max())
        worst = max(worst, diff)
        same = mine == plain[i] == eager
        equal &= same
        log(f"  request {i}: {len(prompts[i])} prompt tokens -> {mine} "
            f"{'== generate == paged|eager' if same else 'DIFFERS: ' + str((plain[i], eager))} "
            f"(logprob diff {diff:.1e})")
    log(f"  {dict(counts)} in {seconds:.1f} s")
    return equal, worst, dict(counts)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=(*MODELS, "all"), default="all")
    parser.add_argument("--checkpoint", help="a local model directory or cached hub name")
    parser.add_argument("--target", choices=("trn1", "trn2"), default="trn2")
    args = parser.parse_args(argv)
    from nki_kernels import simulate

    ok = True
    with simulate.use_target(args.target):
        if args.checkpoint:
            from transformers import AutoModelForCausalLM
            runs = [(args.checkpoint, AutoModelForCausalLM.from_pretrained(
                args.checkpoint, local_files_only=True, dtype="float32").eval())]
        else:
            runs = [(m, tiny_model(m)) for m in (MODELS if args.model == "all" else (args.model,))]
        for name, model in runs:
            print(f"{name} ({args.target}):")
            equal, worst, _ = compare(model)
            good = equal and worst <= TOLERANCE
            ok &= good
            print(f"  {'OK' if good else 'FAILED'}: tokens equal {equal}, worst logprob diff "
                  f"{worst:.1e} (tolerance {TOLERANCE})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
