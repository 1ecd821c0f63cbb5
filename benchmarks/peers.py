"""Our attention beside AWS's production kernels under the same cost model, shape by shape.

    python3 benchmarks/peers.py --nki-library PATH [--quick] [--out benchmarks/results]

``PATH`` is a local checkout of github.com/aws-neuron/nki-library (checked at d2ad3a5); its
``attention_cte`` (prefill: causal, GQA, prior K/V as the prefix) and ``attention_tkg`` (decode
over block KV, the kv heads folded into its batch) run unchanged in the simulator through
``tools/third_party_kernels.py``'s harness; nothing of them is copied here. Rows: prefill of
1k over 1k and over 8k, and every step of the workload suite (``workloads.SUITE``) the peer's
decode kernel can run (decode, verification of a chain of drafts), on LNC=1 and LNC=2 (the
peer's own two-program sharding); the peer reads a length bucket per request
(``peer_bucket``), each request masked to its own keys. One Llama-3-8B attention layer (8 kv /
32 q heads, D 128, bf16); ours and the peer's modelled time, each over the step's floor
(profile/floor.py: bytes over HBM bandwidth, causal FLOPs over TensorE peak, one ScalarE and
one VectorE pass over the scores, the largest), and the ratio ours / peer; each x-floor figure
with its band over the uncertain constants (``profile/sensitivity.band``). Writes
``peers.md``. ``--quick``: smaller shapes (a minute).
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
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))     # workloads.py: the suite

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


def decode_steps(quick=False):
    """The suite's steps the peer's decode kernel can also run (``workloads.SUITE``): decode, and
    verification of a chain of drafts (no custom mask, no cascade, no chunk beside them), as
    (name, kernel, sizes); ``quick``: two small ones."""
    from workloads import SUITE
    if quick:
        return [("decode 4 x 1024", "paged_decode_attention", dict(batch=4, kv_len=1024)),
                ("verify 2 x 4 drafts x 512", "paged_prefill_attention",
                 dict(batch=2, q_len=4, kv_len=512))]
    return [(name, kernel, sizes) for name, kernel, sizes in SUITE
            if kernel == "paged_decode_attention"
            or (kernel == "paged_prefill_attention" and sizes.get("q_len", 1) <= 8
                and "prefill" not in sizes)]


def step_lengths(kernel, sizes):
    """(keys of each request, queries of each) of the suite's step, as ``workloads.run_case``
    makes it (the same seed)."""
    from nki_kernels.registry import KERNELS
    from workloads import LAYER
    inputs = KERNELS[kernel].make({**LAYER, **sizes}, np.random.default_rng(0))
    pages = np.diff(np.asarray(inputs["kv_indptr"]))
    keys = (pages - 1) * LAYER["page_size"] + np.asarray(inputs["kv_last_page_len"])
    return keys.astype(np.int64), int(sizes.get("q_len", 1))


def peer_bucket(longest):
    """The peer's s_prior for a step whose longest request holds ``longest`` keys: that length
    when it is a whole number of 256-key tiles (each of two programs then shards whole 128-row
    tiles), else the next power of two (a serving stack's length bucket), 512 at least."""
    if longest % 256 == 0:
        return int(longest)
    return max(512, 1 << int(longest - 1).bit_length())


def peer_decode(tp, keys, q_len, lnc=1):
    """attention_tkg over block KV (blocks of 16) for requests of ``keys`` keys (the last
    ``q_len`` of each its active tokens), bs = batch x kv heads, q_head = group, s_prior the
    step's bucket (``peer_bucket``): every request reads it whole, masked to its own length."""
    from nki_kernels import simulate
    s_prior = peer_bucket(int(keys.max()))
    prior = np.repeat(np.asarray(keys) - q_len, H)
    inputs = tp._attention_tkg_inputs(bs=len(keys) * H, q_head=G, s_active=q_len,
                                      s_prior=s_prior, d_head=D, block_len=16, lens=prior,
                                      lnc=lnc)
    launch = simulate.simulate(tp._attention_tkg_harness(), target="trn2")
    launch = launch[lnc] if lnc > 1 else launch
    with simulate.tracing() as traces:
        launch(**inputs)
    return _seconds(traces), s_prior


def rows(tp, quick):
    """The side-by-side rows: (step, peer, floor s, ours s, ours' band, peer s, peer's band)."""
    from workloads import run_case
    prefill = [(256, 0, 1), (256, 1024, 1)] if quick else [
        (1024, 0, 1), (1024, 0, 2), (1024, 7168, 1), (1024, 7168, 2)]
    out = []
    for q_len, prior, lnc in prefill:
        pairs = q_len * prior + q_len * (q_len + 1) // 2
        floor = floor_seconds(q_len + prior, q_len, pairs, lnc)
        ours, peer = ours_prefill(q_len, prior, lnc), peer_prefill(tp, q_len, prior, lnc)
        out.append((f"prefill {q_len} over {prior + q_len}, LNC={lnc}", "attention_cte", floor,
                    ours, _band(ours, floor), peer, _band(peer, floor)))
        print(out[-1][:4], flush=True)
    for lnc in (1, 2):
        for name, kernel, sizes in decode_steps(quick):
            mine = run_case(kernel, sizes, "trn2", lnc)
            floor = mine["floor_us"] * 1e-6
            keys, q_len = step_lengths(kernel, sizes)
            peer, s_prior = peer_decode(tp, keys, q_len, lnc)
            out.append((f"{name}, LNC={lnc}", f"attention_tkg (block 16, s_prior {s_prior})",
                        floor, mine["us"] * 1e-6, f"{mine['low']:.1f}-{mine['high']:.1f}", peer,
                        _band(peer, floor)))
            print(out[-1][:4], flush=True)
    return out


def markdown(table):
    lines = ["| step (Llama-3-8B layer, trn2) | peer | floor us | ours us (x floor; band) | "
             "peer us (x floor; band) | ours / peer |", "|" + "---|" * 6]
    for name, peer_name, floor, ours, ours_band, peer, peer_band in table:
        lines.append(f"| {name} | {peer_name} | {floor * 1e6:.1f} | {ours * 1e6:.1f} "
                     f"({ours / floor:.1f}x; {ours_band}) | {peer * 1e6:.1f} "
                     f"({peer / floor:.1f}x; {peer_band}) | {ours / peer:.2f} |")
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
