"""Run NKI Beta 2 kernels of NxD Inference's model ports unchanged in the simulator against
references written here from their docstrings.

Usage::

    python3 tools/nxdi_contrib_kernels.py --nxdi PATH [--only NAME ...]

``PATH`` is a local checkout of github.com/aws-neuron/neuronx-distributed-inference (checked at
4bcdc54); the kernels of ``contrib/models/Qwen3.5-2B/src/nki_kernels`` (gated DeltaNet recurrence
in recurrent, chunked and fused-chunked forms, decode steps, the AutoCP state prefix; Q/K
RMSNorm with partial RoPE) , of ``contrib/models/GLM-5.2`` (MLA decode attention) and ``ltx2-video-audio`` (masked
cross-attention) are imported
from there under ``simulate.install()``; nothing is
copied into this repository. The references follow the docstrings: per (batch, head) a state
S [K, V] (K = V = 128), for each token S <- S exp(g_t); delta = beta_t (v_t - S^T k_t);
S <- S + k_t delta^T; o_t = S^T q_t. Prints ran / matched per case and ``N passed, M failed``.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass
from typing import Callable

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from harness_common import load_file, verdict  # noqa: E402  (tools/, beside this script)

QWEN = "contrib/models/Qwen3.5-2B/src/nki_kernels"
D = 128


@dataclass
class Case:
    name: str
    path: str
    kernel: str
    run: Callable                    # (kernel, module, rng) -> (outputs, expected)
    target: str = "trn2"
    atol: float = 2e-3
    rtol: float = 2e-3


def recurrence(q, k, v, g, beta, state=None):
    """The gated delta rule over tokens (rows): outputs [S, V] and the final state [K, V]."""
    S = np.zeros((D, D)) if state is None else state.astype(np.float64).copy()
    out = np.zeros((q.shape[0], D))
    for t in range(q.shape[0]):
        S *= np.exp(g[t])
        delta = beta[t] * (v[t] - S.T @ k[t])
        S += np.outer(k[t], delta)
        out[t] = S.T @ q[t]
    return out, S


def _tokens(rng, n):
    q = rng.standard_normal((n, D)) / np.sqrt(D)
    k = rng.standard_normal((n, D))
    k /= np.linalg.norm(k, axis=1, keepdims=True)                # l2-normed, as the callers pass
    v = rng.standard_normal((n, D))
    g = -rng.uniform(0.01, 0.2, n)                               # log decay
    beta = rng.uniform(0.1, 0.9, n)                              # sigmoid write gate
    return q, k, v, g, beta


def _f32(*arrays):
    return [np.ascontiguousarray(a, np.float32) for a in arrays]


def _wide(x):
    """A per-token scalar broadcast to 128 columns, as the recurrent kernels take it."""
    return np.repeat(np.asarray(x, np.float32)[:, None], D, axis=1)


def _masks():
    lower = np.tril(np.ones((D, D)), -1)
    return _f32(lower, np.eye(D), np.tril(np.ones((D, D))))


def recurrent_fwd(kernel, module, rng):
    q, k, v, g, beta = _tokens(rng, 40)
    out = kernel(*_f32(q, k, v, _wide(g), _wide(beta)))
    return out, recurrence(q, k, v, g, beta)[0]


def recurrent_fwd_state(kernel, module, rng):
    q, k, v, g, beta = _tokens(rng, 33)
    out, state = kernel(*_f32(q, k, v, _wide(g), _wide(beta)))
    want, S = recurrence(q, k, v, g, beta)
    return (out, state), (want, S)


def recurrent_step(kernel, module, rng):
    q, k, v, g, beta = _tokens(rng, 1)
    state = rng.standard_normal((D, D)) * 0.1
    out, new = kernel(*_f32(q, k, v, _wide(g), _wide(beta), state))
    want, S = recurrence(q, k, v, g, beta, state)
    return (out, new), (want, S)


def recurrent_step_batched(kernel, module, rng):
    heads = 3
    q, k, v, g, beta = _tokens(rng, heads)
    states = rng.standard_normal((heads, D, D)) * 0.1
    out, new = kernel(*_f32(q, k, v, g[:, None], beta[:, None], states.reshape(heads * D, D)))
    want = [recurrence(q[h:h + 1], k[h:h + 1], v[h:h + 1], g[h:h + 1], beta[h:h + 1],
                       states[h]) for h in range(heads)]
    return (out, new), (np.concatenate([w[0] for w in want]),
                        np.concatenate([w[1] for w in want]))


def chunk_step(kernel, module, rng):
    q, k, v, g, beta = _tokens(rng, D)
    state = rng.standard_normal((D, D)) * 0.1
    gc = np.cumsum(g)
    out, new = kernel(*_f32(q, k, v, _wide(beta), _wide(gc), _wide(np.full(D, gc[-1])), state),
                      *_masks())
    want, S = recurrence(q, k, v, g, beta, state)
    return (out, new), (want, S)


def fused_chunked(kernel, module, rng):
    """Raw q, k: the kernel l2-normalises both and scales q by its QUERY_SCALE."""
    n = 2 * D
    _, _, v, g, beta = _tokens(rng, n)
    q_raw, k_raw = rng.standard_normal((n, D)), rng.standard_normal((n, D))
    state = rng.standard_normal((D, D)) * 0.1
    qn = q_raw / np.linalg.norm(q_raw, axis=1, keepdims=True) * getattr(module, "QUERY_SCALE",
                                                                       D ** -0.5)
    kn = k_raw / np.linalg.norm(k_raw, axis=1, keepdims=True)
    out, new = kernel(*_f32(q_raw, k_raw, v, g[:, None], beta[:, None], state), *_masks())
    want, S = recurrence(qn, kn, v, g, beta, state)
    return (out, new), (want, S)


def fused_chunked_legacy(kernel, module, rng):
    """Pre-normalised q, k (its docstring): the recurrence on them as given."""
    n = 2 * D
    q, k, v, g, beta = _tokens(rng, n)
    state = rng.standard_normal((D, D)) * 0.1
    out, new = kernel(*_f32(q, k, v, g[:, None], beta[:, None], state), *_masks())
    want, S = recurrence(q, k, v, g, beta, state)
    return (out, new), (want, S)


def state_prefix(kernel, module, rng):
    n = 3
    M = rng.standard_normal((n, D, D)) / np.sqrt(D)
    B = rng.standard_normal((n, D, D)) * 0.1
    s0 = rng.standard_normal((D, D))
    states, s = [], s0.astype(np.float64)
    for i in range(n):
        states.append(s)
        s = M[i] @ s + B[i]
    got = kernel(*_f32(M, B, s0))
    return got, (np.stack(states), s)


def qk_norm_rope(kernel, module, rng):
    """RMSNorm over head_dim 256 (times gamma), then rotate-half RoPE on the first 64 dims;
    [B, S, H * 256] in, [B, H, S, 256] out, for q and k."""
    B, S, HQ, HK, Dh, R = 2, 130, 2, 1, 256, 64
    q = rng.standard_normal((B, S, HQ * Dh)).astype(np.float32)
    k = rng.standard_normal((B, S, HK * Dh)).astype(np.float32)
    gq, gk = (rng.uniform(0.5, 1.5, Dh).astype(np.float32) for _ in range(2))
    ang = rng.uniform(0, 3, (B, S, R // 2))
    cos = np.concatenate([np.cos(ang), np.cos(ang)], -1).astype(np.float32)
    sin = np.concatenate([np.sin(ang), np.sin(ang)], -1).astype(np.float32)
    eps = 1e-6

    def ref(x, gamma, heads):
        x = x.reshape(B, S, heads, Dh).transpose(0, 2, 1, 3).astype(np.float64)
        x = x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * gamma
        lo, hi = x[..., :R // 2].copy(), x[..., R // 2:R].copy()
        c, s = cos[:, None], sin[:, None]
        x[..., :R // 2] = lo * c[..., :R // 2] - hi * s[..., :R // 2]
        x[..., R // 2:R] = hi * c[..., R // 2:] + lo * s[..., R // 2:]
        return x

    got = kernel(q, k, gq, gk, cos, sin, eps)
    return got, (ref(q, gq, HQ), ref(k, gk, HK))


def mla_decode(kernel, module, rng):
    """GLM-5 MLA decode: per query bh (request bh // n_heads, head bh % n_heads) scores over the
    cache rows [k_pe | c_kv] = scale (q_pe . k_pe + q_nope . c_kv), masked where the mask is 0,
    softmax, weights @ c_kv, then times v_absorb[head]^T."""
    B, H, S, d_rope, d_c, d_v, scale = 2, 2, 700, 64, 512, 256, 0.0625
    q_pe = rng.standard_normal((B * H, d_rope)).astype(np.float32)
    q_nope = rng.standard_normal((B * H, d_c)).astype(np.float32) * 0.2
    cache = rng.standard_normal((B, S, d_rope + d_c)).astype(np.float32)
    v_absorb = rng.standard_normal((H, d_v, d_c)).astype(np.float32) * 0.05
    mask = (rng.random((B * H, S)) < 0.8).astype(np.uint8)
    got = kernel(q_pe, q_nope, cache, v_absorb, mask, softmax_scale=scale, n_heads=H,
                 d_rope=d_rope, d_c=d_c, d_v=d_v, seq_len=S)
    want = np.zeros((B * H, d_v))
    for bh in range(B * H):
        b, h = bh // H, bh % H
        k_pe, c_kv = cache[b, :, :d_rope].astype(np.float64), cache[b, :, d_rope:]
        scores = scale * (k_pe @ q_pe[bh] + c_kv @ q_nope[bh])
        scores = np.where(mask[bh] > 0, scores, -np.inf)
        p = np.exp(scores - scores.max())
        want[bh] = (p / p.sum()) @ c_kv @ v_absorb[h].T
    return got, want


def cross_attention(kernel, module, rng):
    """LTX-2 masked cross-attention, per batch-head: softmax(q k^T + mask) v, q pre-scaled,
    1024 keys, an additive bias per key."""
    BH, Q, S = 2, 256, 1024                         # queries in groups of 128
    q = (rng.standard_normal((BH, Q, D)) / np.sqrt(D)).astype(np.float32)
    k = rng.standard_normal((BH, S, D)).astype(np.float32)
    v = rng.standard_normal((BH, S, D)).astype(np.float32)
    bias = np.where(rng.random((BH, S)) < 0.2, -1e4, 0.0).astype(np.float32)
    got = kernel(q, k, v, bias)
    scores = q.astype(np.float64) @ k.transpose(0, 2, 1) + bias[:, None, :]
    p = np.exp(scores - scores.max(-1, keepdims=True))
    return got, (p / p.sum(-1, keepdims=True)) @ v


def cases():
    P = QWEN
    return [
        Case("LTX-2 masked cross-attention",
             "contrib/models/ltx2-video-audio/src/nki_cross_attention_kernel.py",
             "cross_attn_kernel", cross_attention, atol=5e-3, rtol=5e-3),
        Case("GLM-5 MLA decode attention", "contrib/models/GLM-5.2/src/mla_attention_nki_kernel.py",
             "mla_attention_tkg", mla_decode, atol=5e-3, rtol=5e-3),
        Case("deltanet recurrent forward", f"{P}/nki_deltanet.py", "deltanet_recurrent_fwd",
             recurrent_fwd),
        Case("deltanet recurrent forward + final state", f"{P}/nki_deltanet.py",
             "deltanet_recurrent_fwd_state", recurrent_fwd_state),
        Case("deltanet decode step", f"{P}/nki_deltanet.py", "deltanet_recurrent_step",
             recurrent_step),
        Case("deltanet decode step, batched heads", f"{P}/nki_deltanet.py",
             "_deltanet_recurrent_step_batched_kernel", recurrent_step_batched),
        Case("deltanet chunk step", f"{P}/nki_deltanet_chunked.py", "deltanet_chunk_step",
             chunk_step),
        Case("deltanet fused chunked forward", f"{P}/nki_deltanet_fused.py",
             "deltanet_fused_chunked_fwd", fused_chunked),
        Case("deltanet fused chunked forward (legacy)", f"{P}/nki_deltanet_fused_legacy.py",
             "deltanet_fused_chunked_fwd", fused_chunked_legacy),
        Case("deltanet AutoCP state prefix", f"{P}/nki_deltanet_fused.py",
             "deltanet_autocp_state_prefix", state_prefix),
        Case("Q/K RMSNorm + partial RoPE", f"{P}/qwen_qk_norm_rope.py",
             "qwen_qk_norm_partial_rope_kernel", qk_norm_rope, atol=2e-4, rtol=2e-4),
    ]


def run_case(root, case):
    from nki_kernels import simulate
    rng = np.random.default_rng(0)

    def run():
        module = load_file(root, case.path, "nxdi_")
        return case.run(getattr(module, case.kernel), module, rng)
    with simulate.use_target(case.target):
        return verdict(run, case.atol, case.rtol)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nxdi", required=True, help="neuronx-distributed-inference checkout")
    parser.add_argument("--only", nargs="*")
    args = parser.parse_args(argv)
    from nki_kernels import simulate
    simulate.install()
    good = bad = 0
    for case in cases():
        if args.only and not any(o in case.name for o in args.only):
            continue
        verdict, detail = run_case(args.nxdi, case)
        good, bad = good + (verdict == "matched"), bad + (verdict != "matched")
        print(f"[{case.name}] {verdict}" + (f": {detail}" if detail else ""), flush=True)
    print(f"{good} passed, {bad} failed")
    return 0 if bad == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
