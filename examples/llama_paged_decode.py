"""Greedy generation with a tiny random Llama (HF transformers) over the paged KV cache, on a CPU:
chunked prefill, decode steps and speculative verification of draft tokens.

- Prefill: the prompts are fed ``--chunk`` tokens per request per step, all requests together
  (a mixed batch of chunk lengths); every layer writes the chunk's K/V and attends causally in one
  ``batch_prefill`` launch (fused write).
- Decode: every layer appends K/V with the paged-append kernel and attends with the decode kernel.
- Verify: each request feeds its next token plus draft tokens (here: the model's own greedy
  continuation, one draft corrupted so acceptance stops there); the longest agreeing prefix is
  kept, the rest dropped from the cache.
All kernels run in the NKI simulator through torch custom ops; every step's logits (every fed
token's, when verifying) are compared with the model's own eager forward over the full sequence.
A dense (B, H_kv, max_seq, D) copy of layer 0's newest K is kept with our TensorScatter op and with
ONNX Runtime's TensorScatter, bit for bit.

    python examples/llama_paged_decode.py [--steps 4] [--chunk 3] [--drafts 3]
"""

import argparse
import sys

import numpy as np
import torch

from nki_kernels.torch.llama_paged import PagedLlamaGenerator, tiny_llama

TOLERANCE = 1e-4          # max |logit difference| accepted at fp32


def onnx_tensor_scatter(cache, update, write_indices):
    """Run ONNX TensorScatter-24 (axis 2, linear) in ONNX Runtime."""
    import onnxruntime as ort
    from onnx import TensorProto, helper
    f, i64 = TensorProto.FLOAT, TensorProto.INT64
    node = helper.make_node("TensorScatter", ["past", "update", "w"], ["present"], axis=2)
    graph = helper.make_graph([node], "kv", [helper.make_tensor_value_info("past", f, cache.shape),
                                             helper.make_tensor_value_info("update", f, update.shape),
                                             helper.make_tensor_value_info("w", i64, (cache.shape[0],))],
                              [helper.make_tensor_value_info("present", f, cache.shape)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 24)], ir_version=10)
    options = ort.SessionOptions()
    options.log_severity_level = 3                       # no "in-place optimization" warning
    sess = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return sess.run(None, {"past": cache, "update": update, "w": write_indices})[0]


def eager_logits(model, seq, last):
    """The model's own logits for the ``last`` tokens of ``seq`` [last, V] (eager, full forward)."""
    with torch.no_grad():
        return model(torch.tensor(seq)[None]).logits[0, -last:]


def draft_tokens(model, seq, k, corrupt):
    """The model's greedy continuation of ``seq`` by k tokens; with ``corrupt``, the second one
    replaced, so a verifier accepts exactly one."""
    out = list(seq)
    for _ in range(k):
        out.append(int(eager_logits(model, out, 1)[0].argmax()))
    drafts = out[len(seq):]
    if corrupt and k >= 2:
        drafts[1] = (drafts[1] + 1) % model.config.vocab_size
    return drafts


def run(steps=4, prompts=((5, 17, 2, 99, 3), (7,), (1, 2, 3, 4, 5, 6, 7, 8, 9)), chunk=3,
        drafts=3, log=print):
    """Prefill in chunks, then ``steps`` steps alternating decode and verification; returns the
    worst logit difference from the eager forward."""
    model = tiny_llama()
    gen = PagedLlamaGenerator(model, num_pages=48, page_size=4)
    seqs = [list(p) for p in prompts]
    logits = gen.prefill(seqs, chunk=chunk)
    worst = max(float((logits[b] - eager_logits(model, s, 1)[0]).abs().max())
                for b, s in enumerate(seqs))
    log(f"prefill in chunks of {chunk}: max |logits - HF eager| = {worst:.2e}")
    pending = logits.argmax(-1).tolist()
    max_seq = max(map(len, seqs)) + steps * (drafts + 1) + 1
    dense = torch.zeros((len(seqs), gen.hkv, max_seq, gen.d))
    for step in range(steps):
        if step % 2 == 0:
            logits = gen.decode(torch.tensor(pending))
            for b, t in enumerate(pending):
                seqs[b].append(t)
            worst = max([worst] + [float((logits[b] - eager_logits(model, s, 1)[0]).abs().max())
                                   for b, s in enumerate(seqs)])
            dense = check_dense_update(gen, dense, seqs, log)
            pending = logits.argmax(-1).tolist()
            log(f"step {step} decode: max |logits - HF eager| = {worst:.2e}; next {pending}")
            continue
        proposed = [draft_tokens(model, s + [t], drafts - b % 2, corrupt=b == 0)
                    for b, (s, t) in enumerate(zip(seqs, pending))]
        rows, gained = gen.verify(pending, proposed)
        for b, (s, t, d) in enumerate(zip(seqs, pending, proposed)):
            worst = max(worst, float((rows[b] - eager_logits(model, s + [t] + d, len(d) + 1))
                                     .abs().max()))
            s.extend([t] + gained[b][:-1])
            assert gen.pages.seq_len(gen.rids[b]) == len(s)
        pending = [g[-1] for g in gained]
        log(f"step {step} verify: drafts {[len(d) for d in proposed]}, accepted "
            f"{[len(g) - 1 for g in gained]}; max |logits - HF eager| = {worst:.2e}")
    seqs = [s + [t] for s, t in zip(seqs, pending)]
    log(f"generated: {[s[len(p):] for s, p in zip(seqs, prompts)]}")
    return worst


def check_dense_update(gen, dense, seqs, log):
    """Mirror the newest K of layer 0 into a dense cache with our TensorScatter and with ORT."""
    kv_indptr, kv_indices, last = gen.pages.page_table(gen.rids)
    P = gen.pages.page_size
    newest = []
    for b, rid in enumerate(gen.rids):
        pos = gen.pages.seq_len(rid) - 1
        page = kv_indices[kv_indptr[b] + pos // P]
        newest.append(gen.caches[0][page, 0, pos % P])             # [Hkv, D]
    update = torch.stack(newest)[:, :, None, :]                     # [B, Hkv, 1, D]
    w = torch.tensor([len(s) - 1 for s in seqs], dtype=torch.int64)
    ours = torch.ops.nki_kernels.tensor_scatter(dense, update, w, 2, "linear")
    theirs = onnx_tensor_scatter(dense.numpy(), update.numpy(), w.numpy())
    if not np.array_equal(ours.numpy(), theirs):
        raise AssertionError("TensorScatter kernel and ONNX Runtime disagree")
    log("  dense-cache update: TensorScatter kernel == ONNX Runtime (bit for bit)")
    return ours


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--chunk", type=int, default=3, help="prefill tokens per request per step")
    p.add_argument("--drafts", type=int, default=3, help="draft tokens per verification")
    args = p.parse_args(argv)
    worst = run(args.steps, chunk=args.chunk, drafts=args.drafts)
    ok = worst <= TOLERANCE
    print(f"{'OK' if ok else 'FAILED'}: worst logit difference {worst:.2e} (tolerance {TOLERANCE:.0e})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
