"""Our attention beside AWS's production kernels under the same cost model, shape by shape.

    python3 benchmarks/peers.py --nki-library PATH [--quick] [--out benchmarks/results]

``PATH`` is a local checkout of github.com/aws-neuron/nki-library (checked at d2ad3a5); its
``attention_cte`` (prefill: causal, GQA, prior K/V as the prefix) and ``attention_tkg`` (decode
over block KV, the kv heads folded into its batch) run unchanged in the simulator through
``tools/third_party_kernels.py``'s harness; nothing of them is copied here. Each row: one Llama-3
8B attention layer (8 kv / 32 q heads, D 128, bf16), ours and the peer's modelled time, each
over the step's floor (profile/floor.py: bytes over HBM bandwidth, causal FLOPs over TensorE
peak, one ScalarE and one VectorE pass over the scores, the largest), and the
ratio ours / peer; each x-floor figure with its band over the uncertain constants
(``profile/sensitivity.band``). Writes ``peers.md``. ``--quick``: smaller shapes (a minute).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys

import ml_dtypes
import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

H, G, D = 8, 4, 128
BF16 = ml_dtypes.bfloat16


def _harness():
    spec = importlib.util.spec_from_file_location(
        "third_party_kernels", os.path.join(ROOT, "tools", "third_party_kernels.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules["third_party_kernels"] = module          # its dataclasses look themselves up
    spec.loader.exec_module(module)
    return module


class Timed(float):
    """Modelled seconds of a step, with its traces (for the band over the uncertain constants)."""

    traces: list = []


def _seconds(traces, target="trn2"):
    from nki_kernels.profile import estimate
    out = Timed(sum(estimate(t, target=target).seconds for t in traces))
    out.traces = list(traces)
    return out


def _band(timed, floor):
    from nki_kernels.profile.sensitivity import band
    low, high = band(timed.traces, "trn2", floor)
    return f"{low:.1f}-{high:.1f}"


def floor_seconds(kv_tokens, q_tokens, pairs, cores=1, target="trn2"):
    """The step's floor (``profile/floor.py``): K/V read once, q read and out written over HBM
    bandwidth; the causal scores' FLOPs over TensorE peak, one ScalarE and one VectorE pass."""
    from nki_kernels.profile.constants import hardware
    from nki_kernels.profile.floor import attention_floor
    nbytes = 2 * kv_tokens * H * D * 2 + 2 * q_tokens * H * G * D * 2
    return attention_floor(hardware(target), nbytes, pairs * H * G, D, cores).seconds


def ours_prefill(q_len, prior, lnc=1):
    from nki_kernels import simulate
    from nki_kernels.registry import KERNELS
    spec = KERNELS["paged_prefill_attention"]
    inputs = spec.make(dict(batch=1, q_len=q_len, kv_len=q_len + prior, page_size=16, kv_heads=H,
                            group=G, head_dim=D, dtype="bfloat16"), np.random.default_rng(0))
    inputs["lnc"] = lnc
    with simulate.use_target("trn2"), simulate.tracing() as traces:
        spec.run(inputs)
    return _seconds(traces)


def peer_prefill(tp, q_len, prior, lnc=1):
    """attention_cte over one layer: q [HQ, S, D], K^T [H, D, S], V [H, S, D], the prefix as
    prior K/V."""
    from nki_kernels import simulate
    rng = np.random.default_rng(0)
    kernel = tp._fn("core.attention.attention_cte:attention_cte")
    args = {"q": tp._randn(rng, H * G, q_len, D, dtype=BF16),
            "k": tp._randn(rng, H, D, q_len, dtype=BF16),
            "v": tp._randn(rng, H, q_len, D, dtype=BF16)}
    if prior:
        args.update(k_prior=tp._randn(rng, H, D, prior, dtype=BF16),
                    v_prior=tp._randn(rng, H, prior, D, dtype=BF16),
                    prior_used_len=np.array([prior], np.int32))
    launch = simulate.simulate(kernel, target="trn2")
    launch = launch[lnc] if lnc > 1 else launch
    with simulate.tracing() as traces:
        launch(**args)
    return _seconds(traces)


def ours_decode(batch, kv_len):
    from nki_kernels import simulate
    from nki_kernels.registry import KERNELS
    spec = KERNELS["paged_decode_attention"]
    inputs = spec.make(dict(batch=batch, kv_len=kv_len, page_size=16, kv_heads=H, group=G,
                            head_dim=D, dtype="bfloat16"), np.random.default_rng(0))
    with simulate.use_target("trn2"), simulate.tracing() as traces:
        spec.run(inputs)
    return _seconds(traces)


def peer_decode(tp, batch, kv_len):
    """attention_tkg over block KV (blocks of 16), bs = batch x kv heads, q_head = group."""
    from nki_kernels import simulate
    inputs = tp._attention_tkg_inputs(bs=batch * H, q_head=G, s_active=1, s_prior=kv_len,
                                      d_head=D, block_len=16)
    launch = simulate.simulate(tp._attention_tkg_harness(), target="trn2")
    with simulate.tracing() as traces:
        launch(**inputs)
    return _seconds(traces)


def rows(tp, quick):
    prefill = [(256, 0, 1), (256, 1024, 1)] if quick else [
        (1024, 0, 1), (1024, 0, 2), (1024, 7168, 1), (1024, 7168, 2)]
    decode = [(4, 1024)] if quick else [(32, 4096), (8, 2048)]
    out = []
    for q_len, prior, lnc in prefill:
        pairs = q_len * prior + q_len * (q_len + 1) // 2
        floor = floor_seconds(q_len + prior, q_len, pairs, lnc)
        ours, peer = ours_prefill(q_len, prior, lnc), peer_prefill(tp, q_len, prior, lnc)
        out.append((f"prefill {q_len} over {prior + q_len}, LNC={lnc}", "attention_cte", floor,
                    ours, peer))
        print(out[-1], flush=True)
    for batch, kv_len in decode:
        floor = floor_seconds(batch * kv_len, batch, batch * kv_len)
        ours, peer = ours_decode(batch, kv_len), peer_decode(tp, batch, kv_len)
        out.append((f"decode {batch} x {kv_len}, LNC=1", "attention_tkg (block 16)", floor,
                    ours, peer))
        print(out[-1], flush=True)
    return out


def markdown(table):
    lines = ["| step (Llama-3-8B layer, trn2) | peer | floor us | ours us (x floor; band) | "
             "peer us (x floor; band) | ours / peer |", "|" + "---|" * 6]
    for name, peer_name, floor, ours, peer in table:
        lines.append(f"| {name} | {peer_name} | {floor * 1e6:.1f} | {ours * 1e6:.1f} "
                     f"({ours / floor:.1f}x; {_band(ours, floor)}) | {peer * 1e6:.1f} "
                     f"({peer / floor:.1f}x; {_band(peer, floor)}) | {ours / peer:.2f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nki-library", required=True)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", default=os.path.join("benchmarks", "results"))
    args = parser.parse_args(argv)
    sys.path.insert(0, os.path.join(os.path.abspath(args.nki_library), "src"))
    from nki_kernels import simulate
    simulate.install()
    tp = _harness()
    table = markdown(rows(tp, args.quick))
    print(table)
    if args.out and not args.quick:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "peers.md"), "w") as f:
            f.write(table + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
