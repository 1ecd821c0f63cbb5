"""Run third-party NKI Beta 2 kernels unchanged in the simulator against their own references.

Usage::

    python3 tools/third_party_kernels.py --nki-library PATH [--only NAME ...] [--target trn2]

``PATH`` is a local checkout of github.com/aws-neuron/nki-library (its kernels and their PyTorch
references are imported from there; nothing of it is copied into this repository). Each case builds
small inputs, runs the kernel through ``simulate.install()`` (plain ``import nki`` in the kernel
source), runs the kernel's own ``*_torch`` reference on the same inputs, and compares. Prints one
line per case: ran / matched / the first error, and a closing ``N passed, M failed`` line.
Subkernels that take an SBUF allocator and a config object (``attention_tkg``) run inside a small
``@nki.jit`` harness of ours (``_attention_tkg_harness``); the kernel code itself is the library's.
"""

from __future__ import annotations

import argparse
import importlib
import os
import subprocess
import sys
import traceback
from dataclasses import dataclass, field
from typing import Callable, Optional

import ml_dtypes
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from nki_kernels.simulate.collectives import ReplicaGroup  # noqa: E402  (nki.collectives.ReplicaGroup)

BF16 = ml_dtypes.bfloat16
LIB = "nkilib_src.nkilib."


@dataclass
class Case:
    """One kernel run: ``kernel``/``ref`` are "module:function" under nkilib_src.nkilib."""

    name: str
    kernel: str
    ref: str
    inputs: Callable[[np.random.Generator], dict]
    static: dict = field(default_factory=dict)      # non-tensor kernel arguments
    ref_static: Optional[dict] = None               # reference's, when they differ
    ref_args: Optional[Callable[[dict], dict]] = None   # reference inputs from kernel inputs
    outputs: Optional[Callable] = None              # (result, inputs) -> arrays to compare
    reference: Optional[Callable] = None            # inputs -> arrays, when there is no torch ref
    lnc: int = 1
    ranks: int = 0                                  # > 0: a multi-rank (collectives) job;
    # then list-valued inputs hold one array per rank and the result is the list of the ranks'
    target: Optional[str] = None
    rtol: float = 1e-3
    atol: float = 1e-3


def _fn(path):
    if callable(path):                              # a harness of ours around a library kernel
        return path()
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(LIB + module), name)


def _randn(rng, *shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


def _sparse(rng, T, E, k):
    flat = rng.permutation(np.concatenate([np.ones(k * E), np.zeros((T - k) * E)]))
    return flat.reshape(E, T).T.astype(np.float32)


def _per_rank_rows(rng, ranks, rows, cols, dtype=np.float32):
    return {"inp": [_randn(rng, rows, cols, dtype=dtype) for _ in range(ranks)]}


def _gathered(inputs):
    """What every rank holds after an all-gather along the last dim."""
    ranks = len(inputs["inp"])
    return [np.concatenate(inputs["inp"], axis=1)] * ranks


def _attention_tkg_harness():
    """Our @nki.jit harness around nki-library's ``attention_tkg`` subkernel (which takes an
    SBUF allocator and its config object): allocate, place q / k_active in SBUF when the config
    says so, call the kernel, return its HBM output."""
    import nki
    import nki.isa as nisa
    import nki.language as nl
    attention = importlib.import_module(LIB + "core.attention.attention_tkg")
    allocator = importlib.import_module(LIB + "core.utils.allocator")
    logging = importlib.import_module(LIB + "core.utils.logging")

    @nki.jit
    def attention_tkg_case(q, k_active, v_active, k_prior, v_prior, mask, active_blocks_table,
                           cfg, out_shape):
        sbm = allocator.SbufManager(0, nl.tile_size.total_available_sbuf_size - 16 * 1024,
                                    logging.Logger("SBM"))
        sbm.open_scope()
        out = nl.ndarray(out_shape, dtype=q.dtype, buffer=nl.shared_hbm)
        if cfg.qk_in_sb:
            q_in = sbm.alloc_stack(q.shape, dtype=q.dtype, buffer=nl.sbuf)
            k_in = sbm.alloc_stack(k_active.shape, dtype=k_active.dtype, buffer=nl.sbuf)
            nisa.dma_copy(q_in, q)
            nisa.dma_copy(k_in, k_active)
        else:
            q_in, k_in = q, k_active
        attn_out, _ = attention.attention_tkg(q_in, k_in, v_active, k_prior, v_prior, mask, out,
                                              cfg, sbm, None, None, None, None,
                                              active_blocks_table, None)
        sbm.close_scope()
        return attn_out
    return attention_tkg_case


def _attention_tkg_inputs(bs, q_head, s_active, s_prior, d_head, block_len=0, tp_k_prior=True,
                          dtype=BF16, lens=None, lnc=1):
    """Inputs of one decode step over a flat (block_len 0) or block KV cache, cache lengths
    differing per request (``lens``: [bs] prior lengths, each at most s_prior - s_active; else
    spread by a formula), and the kernel's config; the mask from the library's own builder, for
    a grid of ``lnc`` programs (the kernel shards batch or s_prior between two)."""
    import torch
    utils = importlib.import_module(LIB + "core.attention.attention_tkg_utils")
    masks = importlib.import_module(LIB + "core.attention.gen_mask_tkg_torch")
    block = block_len > 0
    cfg = utils.AttnTKGConfig(bs=bs, q_head=q_head, s_active=s_active, curr_sprior=s_prior,
                              full_sprior=s_prior, d_head=d_head, block_len=block_len,
                              tp_k_prior=tp_k_prior or block, qk_in_sb=True,
                              strided_mm1=not block)
    rng = np.random.default_rng(1)
    if lens is None:
        lens = np.array([(s_prior * 3 // 4 + 37 * b) % (s_prior - s_active) for b in range(bs)])
    lens = np.asarray(lens)
    if lens.shape != (bs,) or lens.min() < 0 or lens.max() > s_prior - s_active:
        raise ValueError(f"lens: {bs} prior lengths in [0, {s_prior - s_active}] expected")
    q_shape, ka_shape = (d_head, bs * q_head * s_active), (d_head, bs * s_active)   # in SBUF
    if block:
        blocks = bs * s_prior // block_len
        k_shape = v_shape = (blocks, block_len, d_head)
        table = rng.permutation(blocks).reshape(bs, s_prior // block_len).astype(np.uint32)
    else:
        k_shape = (bs, 1, s_prior, d_head) if tp_k_prior else (bs, 1, d_head, s_prior)
        v_shape = (bs, 1, s_prior, d_head)
        table = None
    mask = masks.build_full_attention_mask(
        cache_lens=torch.from_numpy(lens.astype(np.float32)), batch=bs, num_heads=q_head,
        s_active=s_active, s_ctx=s_prior, lnc=lnc, block_len=block_len, include_active_mask=True,
        transposed=True).numpy().astype(np.uint8)
    return {"q": _randn(rng, *q_shape, dtype=dtype), "k_active": _randn(rng, *ka_shape, dtype=dtype),
            "v_active": _randn(rng, bs, 1, s_active, d_head, dtype=dtype),
            "k_prior": _randn(rng, *k_shape, dtype=dtype), "v_prior": _randn(rng, *v_shape, dtype=dtype),
            "mask": mask, "active_blocks_table": table, "cfg": cfg,
            "out_shape": (bs, q_head, d_head, s_active)}


def _attention_tkg_reference(a):
    import torch
    ref = importlib.import_module(LIB + "core.attention.attention_tkg_torch").attention_tkg_torch_ref
    t = {k: _to_torch(v) for k, v in a.items() if isinstance(v, np.ndarray)}
    if a["active_blocks_table"] is not None:          # torch indexes with int64
        t["active_blocks_table"] = torch.from_numpy(a["active_blocks_table"].astype(np.int64))
    out, _ = ref[1](q=t["q"], k_active=t["k_active"], v_active=t["v_active"],
                    k_prior=t["k_prior"], v_prior=t["v_prior"], mask=t["mask"],
                    out=torch.zeros(a["out_shape"], dtype=torch.float32), cfg=a["cfg"], sbm=None,
                    inv_freqs=None, rope_pos_ids=None, start_pos_ids=None, sink=None,
                    active_blocks_table=t.get("active_blocks_table"), k_out=None,
                    DBG_TENSORS=None)
    return [out.float().numpy()]


def _attention_tkg_case(name, **sizes):
    return Case(name, _attention_tkg_harness, None, lambda r: _attention_tkg_inputs(**sizes),
                reference=_attention_tkg_reference, rtol=2e-2, atol=2e-2)


CASES = [
    Case("cumsum", "core.cumsum.cumsum:cumsum", "core.cumsum.cumsum_torch:cumsum_torch_ref",
         lambda r: {"x": _randn(r, 3, 5, 300)}),
    Case("cumsum_bf16", "core.cumsum.cumsum:cumsum", "core.cumsum.cumsum_torch:cumsum_torch_ref",
         lambda r: {"x": _randn(r, 64, 256, dtype=BF16)}, rtol=2e-2, atol=2e-2),
    Case("cascaded_max", "core.max.cascaded_max:cascaded_max",
         "core.max.cascaded_max_torch:cascaded_max_torch_ref",
         lambda r: {"input_tensor": _randn(r, 2, 1, 4096)}),
    Case("rope", "core.embeddings.rope:RoPE", "core.embeddings.rope_torch:rope_torch_ref",
         lambda r: {"x_in": _randn(r, 64, 2, 4, 128), "cos": _randn(r, 32, 2, 128),
                    "sin": _randn(r, 32, 2, 128)}),
    Case("rope_lnc2", "core.embeddings.rope:RoPE", "core.embeddings.rope_torch:rope_torch_ref",
         lambda r: {"x_in": _randn(r, 64, 2, 4, 256), "cos": _randn(r, 32, 2, 256),
                    "sin": _randn(r, 32, 2, 256)}, static={"lnc_shard": True}, lnc=2),
    Case("rope_hf", "core.embeddings.rope_hf:rope_hf",
         "core.embeddings.rope_hf_torch:rope_hf_torch_ref",
         lambda r: {"q": _randn(r, 1, 4, 128, 64), "k": _randn(r, 1, 2, 128, 64),
                    "q_out": np.zeros((1, 4, 128, 64), np.float32),
                    "k_out": np.zeros((1, 2, 128, 64), np.float32),
                    "cos": _randn(r, 1, 128, 64), "sin": _randn(r, 1, 128, 64)}),
    Case("find_nonzero_indices", "core.subkernels.find_nonzero_indices:find_nonzero_indices",
         "core.subkernels.find_nonzero_indices_torch:find_nonzero_indices_torch_ref",
         lambda r: {"input_tensor": _sparse(r, 256, 8, 32)}),
    Case("cross_entropy_forward", "experimental.loss.cross_entropy:cross_entropy_forward",
         "experimental.loss.cross_entropy_torch:cross_entropy_forward_torch_ref",
         lambda r: {"logits_hbm": _randn(r, 64, 1000),
                    "targets_hbm": r.integers(0, 1000, 64).astype(np.int32)},
         static={"dtype": "float32", "chunk_size": 512}, ref_static={},
         ref_args=lambda a: {"logits": a["logits_hbm"], "targets": a["targets_hbm"].astype(np.int64)}),
    Case("dynamic_elementwise_add",
         "experimental.dynamic_shapes.dynamic_elementwise_add:dynamic_elementwise_add",
         "experimental.dynamic_shapes.dynamic_elementwise_add_torch:dynamic_elementwise_add_torch_ref",
         lambda r: {"input_a": _randn(r, 512, 512, dtype=BF16), "input_b": _randn(r, 512, 512, dtype=BF16),
                    "num_m_tiles": np.array([[3]], np.int32)},
         ref_args=lambda a: {"input_a": a["input_a"][:384], "input_b": a["input_b"][:384]},
         outputs=lambda out, _: [out[:384]], rtol=1e-2, atol=1e-2),
    Case("cross_entropy_backward", "experimental.loss.cross_entropy:cross_entropy_backward",
         "experimental.loss.cross_entropy_torch:cross_entropy_backward_torch_ref",
         lambda r: _ce_backward_inputs(r, 64, 1000),
         static={"dtype": "float32", "chunk_size": 512, "inplace": False}, ref_static={},
         ref_args=lambda a: {"logits": a["logits_hbm"], "targets": a["targets_hbm"].astype(np.int64)}),
    Case("indexed_flatten", "core.subkernels.indexed_flatten:indexed_flatten",
         "core.subkernels.indexed_flatten_torch:indexed_flatten_torch_ref",
         lambda r: {"input_tensor": np.arange(3 * 4096, dtype=np.int32).reshape(3, 4096),
                    "row_offsets": np.array([0, 32, 64], np.int32)},
         static={"f_len": 128, "output_len": 13312, "padding_val": -1}, lnc=2, rtol=0, atol=0),
    Case("rmsnorm_tkg", "core.subkernels.rmsnorm_tkg:rmsnorm_tkg",
         "core.subkernels.rmsnorm_torch:rmsnorm_tkg_torch_ref_lnc1",
         lambda r: {"input": _randn(r, 1, 4, 2048, dtype=np.float16),
                    "gamma": _randn(r, 1, 2048, dtype=np.float16),
                    "output": np.zeros((128, 4, 16), np.float16)},
         static={"hidden_actual": 1920}, outputs=lambda _, a: [a["output"]], rtol=1e-2, atol=1e-2),
    Case("rmsnorm_tkg_lnc2", "core.subkernels.rmsnorm_tkg:rmsnorm_tkg",
         "core.subkernels.rmsnorm_torch:rmsnorm_tkg_torch_ref",
         lambda r: {"input": _randn(r, 2, 8, 3072, dtype=np.float16),
                    "gamma": _randn(r, 1, 3072, dtype=np.float16),
                    "output": np.zeros((128, 16, 24), np.float16)},
         lnc=2, outputs=lambda _, a: [a["output"]], rtol=1e-2, atol=1e-2),
    Case("layernorm_tkg", "core.subkernels.layernorm_tkg:layernorm_tkg",
         "core.subkernels.layernorm_torch:layernorm_tkg_torch_ref_lnc1",
         lambda r: {"input": _randn(r, 1, 4, 2048, dtype=np.float16),
                    "gamma": _randn(r, 1, 2048, dtype=np.float16),
                    "output": np.zeros((128, 4, 16), np.float16),
                    "beta": _randn(r, 1, 2048, dtype=np.float16)},
         outputs=lambda _, a: [a["output"]], rtol=1e-2, atol=1e-2),
    Case("find_nonzero_indices_with_count",
         "experimental.benchmark.find_nonzero_indices_with_count:find_nonzero_indices_with_count",
         None, lambda r: {"input_tensor": (r.random((1, 512)) < 0.2).astype(np.float32)},
         reference=lambda a: [_nonzero_with_count_ref(a["input_tensor"][0])], rtol=0, atol=0),
    Case("allgather_sb2sb", "experimental.collectives.sb2sb_allgather:allgather_sb2sb", "",
         lambda rng: _per_rank_rows(rng, 4, 64, 24, BF16),
         static={"replica_groups": ReplicaGroup([[0, 1, 2, 3]]), "tp_degree": 4}, ranks=4,
         reference=_gathered, rtol=0, atol=0),
    Case("allgather_sb2sb_tiled",
         "experimental.collectives.sb2sb_allgather:allgather_sb2sb_tiled", "",
         lambda rng: _per_rank_rows(rng, 2, 256, 40),
         static={"replica_groups": ReplicaGroup([[0, 1]]), "tp_degree": 2}, ranks=2,
         reference=_gathered, rtol=0, atol=0),
    Case("attention_cte_causal", "core.attention.attention_cte:attention_cte",
         "core.attention.attention_cte_torch:attention_cte_torch_ref",
         lambda r: {"q": _randn(r, 2, 256, 64, dtype=BF16), "k": _randn(r, 2, 64, 256, dtype=BF16),
                    "v": _randn(r, 2, 256, 64, dtype=BF16)},
         static={"scale": 0.125}, rtol=2e-2, atol=2e-2),
    Case("attention_cte_gqa_window", "core.attention.attention_cte:attention_cte",
         "core.attention.attention_cte_torch:attention_cte_torch_ref",
         lambda r: {"q": _randn(r, 4, 384, 64, dtype=BF16), "k": _randn(r, 2, 64, 384, dtype=BF16),
                    "v": _randn(r, 2, 384, 64, dtype=BF16)},
         static={"sliding_window": 100}, rtol=2e-2, atol=2e-2),
    Case("attention_cte_prefix", "core.attention.attention_cte:attention_cte",
         "core.attention.attention_cte_torch:attention_cte_torch_ref",
         lambda r: {"q": _randn(r, 2, 128, 64, dtype=BF16), "k": _randn(r, 2, 64, 128, dtype=BF16),
                    "v": _randn(r, 2, 128, 64, dtype=BF16),
                    "k_prior": _randn(r, 2, 64, 512, dtype=BF16),
                    "v_prior": _randn(r, 2, 512, 64, dtype=BF16),
                    "prior_used_len": np.array([300], np.int32)},
         rtol=2e-2, atol=2e-2),
    Case("conv1d", "experimental.conv.conv1d:conv1d", "experimental.conv.conv1d_torch:conv1d_torch_ref",
         lambda r: {"x_in": _randn(r, 2, 64, 100), "filters": _randn(r, 3, 64, 96),
                    "bias": _randn(r, 96)}, static={"padding": (1, 1)}),
    Case("conv1d_strided_dilated", "experimental.conv.conv1d:conv1d",
         "experimental.conv.conv1d_torch:conv1d_torch_ref",
         lambda r: {"x_in": _randn(r, 1, 160, 90), "filters": _randn(r, 5, 160, 40)},
         static={"stride": 2, "dilation": 2, "padding": (2, 0)}),
    Case("output_projection_tkg", "core.output_projection.output_projection_tkg:output_projection_tkg",
         "core.output_projection.output_projection_tkg_torch:output_projection_tkg_torch_ref",
         lambda r: {"attention": _randn(r, 64, 2, 4, 1, dtype=BF16),
                    "weight": _randn(r, 256, 512, dtype=BF16),
                    "bias": _randn(r, 1, 512, dtype=BF16)}, rtol=3e-2, atol=3e-1),
    Case("topk_reduce", "experimental.collectives.topk_reduce:topk_reduce",
         "experimental.collectives.topk_reduce_torch:topk_reduce_torch_ref",
         lambda r: _topk_reduce_inputs(r, T=8, K=2, ranks=4, H=96), static={"T": 8, "K": 2},
         rtol=2e-2, atol=2e-2),
    Case("rotational_topk", "core.topk.rotational_topk:rotational_topk",
         "core.topk.torch_ref:topk_torch_ref", lambda r: _topk_inputs(r, 4, 4096, 16),
         ref_args=lambda a: {"inp": a["inp"], "config": a["config"]},
         outputs=lambda out, _: [np.asarray(o).reshape(4, 16) for o in out], rtol=0, atol=0),
    Case("rotational_topk_padded_k", "core.topk.rotational_topk:rotational_topk",
         "core.topk.torch_ref:topk_torch_ref", lambda r: _topk_inputs(r, 3, 1000, 10),
         ref_args=lambda a: {"inp": a["inp"], "config": a["config"]},
         outputs=lambda out, _: [np.asarray(o).reshape(3, 10) for o in out], rtol=0, atol=0),
    _attention_tkg_case("attention_tkg_flat_kT", bs=2, q_head=4, s_active=1, s_prior=512,
                        d_head=64, tp_k_prior=False),
    _attention_tkg_case("attention_tkg_flat", bs=2, q_head=4, s_active=2, s_prior=512,
                        d_head=64, tp_k_prior=True),
    _attention_tkg_case("attention_tkg_block16", bs=2, q_head=4, s_active=1, s_prior=512,
                        d_head=64, block_len=16),
]


def _topk_reduce_inputs(rng, T, K, ranks, H):
    """The sparse all_to_all_v output an MoE combine reduces: T * K rows scattered over
    ranks * T slots, each carrying its token id as an int32 packed in the last two bf16
    columns; the other rows hold zeros and token id -1."""
    rows = ranks * T
    data = np.zeros((rows, H + 2), BF16)
    ids = np.full(rows, -1, np.int32)
    where = rng.permutation(rows)[:T * K]
    ids[where] = np.repeat(np.arange(T, dtype=np.int32), K)
    data[where, :H] = rng.standard_normal((T * K, H)).astype(BF16)
    data[:, H:] = ids.view(np.uint16).reshape(rows, 2).view(BF16)
    return {"input": data}


def _topk_inputs(rng, rows, vocab, k):
    """Rows of scores and the kernel's own config, built by the library's factories (host code,
    as its tests do)."""
    import nki.language as nl
    utils = importlib.import_module(LIB + "core.topk.rotational_topk")
    inp = rng.standard_normal((rows, vocab)).astype(np.float32)
    topk = utils.create_topk_config(inp_shape=(rows, 1, vocab), inp_dtype=nl.float32, k=k,
                                    sorted=True, num_programs=1)
    config = utils.prepare_rotational_constants(
        utils.create_rotational_topk_config(inp_shape=inp.shape, topk_config=topk))
    return {"inp": inp, "config": config}


def _ce_backward_inputs(rng, n, vocab):
    import torch
    logits = _randn(rng, n, vocab)
    targets = rng.integers(0, vocab, n).astype(np.int32)
    lse = torch.logsumexp(torch.from_numpy(logits), dim=-1).numpy().astype(np.float32)
    return {"logits_hbm": logits, "targets_hbm": targets, "lse_state_hbm": lse}


def _nonzero_with_count_ref(row):
    """The benchmark kernel's documented output: indices of non-zeros, -1 padding, the count."""
    hits = np.flatnonzero(row)
    out = np.full(row.size + 1, -1, np.int64)
    out[:hits.size] = hits
    out[-1] = hits.size
    return out.reshape(1, -1)


def _to_torch(value):
    import torch
    if isinstance(value, np.ndarray):
        if value.dtype == BF16:
            return torch.from_numpy(value.astype(np.float32)).to(torch.bfloat16)
        return torch.from_numpy(value.copy())
    return value


def _flatten(result):
    import torch
    if isinstance(result, dict):
        result = list(result.values())
    if not isinstance(result, (list, tuple)):
        result = [result]
    out = []
    for r in result:
        if isinstance(r, torch.Tensor):
            r = r.detach().float().numpy() if r.is_floating_point() else r.numpy()
        out.append(np.asarray(r))
    return out


def run_case(case: Case):
    from nki_kernels import simulate
    if case.static.get("dtype") in ("float32", "bfloat16"):
        case.static["dtype"] = getattr(sys.modules["nki.language"], case.static["dtype"])
    rng = np.random.default_rng(0)
    inputs = case.inputs(rng)
    kernel = _fn(case.kernel)
    launch = simulate.simulate(kernel, target=case.target, ranks=case.ranks or None)
    launch = launch[case.lnc] if case.lnc > 1 else launch
    kernel_inputs = {k: v.copy() if isinstance(v, np.ndarray) else v for k, v in inputs.items()}
    if case.ranks:
        kernel_inputs = {k: simulate.per_rank(v) if isinstance(v, list) else v
                         for k, v in kernel_inputs.items()}
    result = launch(**kernel_inputs, **case.static)
    got = case.outputs(result, kernel_inputs) if case.outputs else _flatten(result)
    ref_inputs = case.ref_args(inputs) if case.ref_args else inputs
    ref_static = case.static if case.ref_static is None else case.ref_static
    if case.reference is not None:
        want = [np.asarray(w) for w in case.reference(ref_inputs)]
    else:
        want = _flatten(_fn(case.ref)(**{k: _to_torch(v) for k, v in ref_inputs.items()},
                                      **ref_static))
    if len(got) < len(want):
        raise AssertionError(f"kernel returned {len(got)} outputs, reference {len(want)}")
    for i, (g, w) in enumerate(zip(got, want)):
        g = np.asarray(g).astype(np.float64)
        np.testing.assert_allclose(g.reshape(w.shape), w.astype(np.float64), rtol=case.rtol,
                                   atol=case.atol, err_msg=f"output {i}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nki-library", required=True, help="checkout of aws-neuron/nki-library")
    parser.add_argument("--only", nargs="*", help="case names to run")
    parser.add_argument("--target", default=None, help="trn1 | trn2 | trn3 (default: per case)")
    parser.add_argument("--verbose", action="store_true", help="print tracebacks")
    args = parser.parse_args(argv)
    root = os.path.abspath(args.nki_library)
    sys.path.insert(0, os.path.join(root, "src"))
    try:
        commit = subprocess.run(["git", "-C", root, "rev-parse", "HEAD"], capture_output=True,
                                text=True).stdout.strip() or "unknown"
    except OSError:
        commit = "unknown"
    from nki_kernels import simulate
    simulate.install()
    print(f"nki-library at {root} (commit {commit})")
    passed = failed = 0
    for case in CASES:
        if args.only and case.name not in args.only:
            continue
        if args.target:
            case.target = args.target
        try:
            run_case(case)
            passed += 1
            print(f"  ran, matched   {case.name:28s} {case.kernel}")
        except Exception as err:                     # report and go on to the next kernel
            failed += 1
            stage = "ran, MISMATCH" if isinstance(err, AssertionError) and "output" in str(err) \
                else "FAILED       "
            first = str(err).strip().splitlines()[0][:160] if str(err).strip() else ""
            print(f"  {stage} {case.name:28s} {type(err).__name__}: {first}")
            if args.verbose:
                traceback.print_exc()
    print(f"{passed} passed, {failed} failed")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
