"""Greedy decoding of a tiny random Llama (HF transformers) over the paged KV cache, on a CPU.

Every layer appends K/V with the paged-append kernel and attends with the decode kernel (both run
in the NKI simulator through torch custom ops); each step's logits are compared with the model's
own eager forward over the full sequence. A dense (B, H_kv, max_seq, D) copy of layer 0's cache is
kept up to date with our TensorScatter op and with ONNX Runtime's TensorScatter, bit for bit.

    python examples/llama_paged_decode.py [--steps 4]
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


def run(steps=4, prompts=((5, 17, 2, 99, 3), (7,), (1, 2, 3, 4, 5, 6, 7, 8, 9)), log=print):
    model = tiny_llama()
    gen = PagedLlamaGenerator(model, num_pages=32, page_size=4)
    seqs = [list(p) for p in prompts]
    logits = gen.prefill(seqs)
    worst = 0.0
    max_seq = max(map(len, seqs)) + steps
    dense = torch.zeros((len(seqs), gen.hkv, max_seq, gen.d))
    for step in range(steps + 1):
        for b, seq in enumerate(seqs):
            with torch.no_grad():
                ref = model(torch.tensor(seq)[None]).logits[0, -1]
            worst = max(worst, float((logits[b] - ref).abs().max()))
        tokens = logits.argmax(-1)
        log(f"step {step}: max |logits - HF eager| = {worst:.2e}; next tokens {tokens.tolist()}")
        if step == steps:
            break
        for b, t in enumerate(tokens.tolist()):
            seqs[b].append(t)
        logits = gen.decode(tokens)
        dense = check_dense_update(gen, dense, seqs, log)
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
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--steps", type=int, default=4)
    args = p.parse_args(argv)
    worst = run(args.steps)
    ok = worst <= TOLERANCE
    print(f"{'OK' if ok else 'FAILED'}: worst logit difference {worst:.2e} (tolerance {TOLERANCE:.0e})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
