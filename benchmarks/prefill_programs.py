"""Chunked-prefill programs against time: the planning policies over one serving loop.

    python3 benchmarks/prefill_programs.py [--steps 60] [--out benchmarks/results]

A chunked-prefill launch's static arguments (its tail sizes, the units it folds without a loop)
are chosen per launch among a few per bucket; each distinct set is a compile. The policies
(environment settings, ``nki_kernels.buckets``) trade programs for time: the default; leads a
launch reaches (``NKI_KERNELS_LEAD=launch``); tail sizes on a ladder
(``NKI_KERNELS_TAIL_PROFILE=ladder``); both; exact tails within four programs more a bucket
(``NKI_KERNELS_TAIL_PROGRAMS=4``). Each runs the same loop: ``batch_prefill`` of 9-16 chunks
of 65-96 queries over 100-1600 keys a step, new lengths and pages every step, one Llama-3-8B
layer on trn2 (LNC=1 and 2); reported: the mean modelled time a step and the distinct kernel
compile keys (what ``nki.jit`` would compile) after the loop.
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from workloads import LAYER, settings, write_table  # noqa: E402

POLICIES = (
    ("default", {}),
    ("leads a launch reaches", {"NKI_KERNELS_LEAD": "launch"}),
    ("tail ladder", {"NKI_KERNELS_TAIL_PROFILE": "ladder"}),
    ("both", {"NKI_KERNELS_LEAD": "launch", "NKI_KERNELS_TAIL_PROFILE": "ladder"}),
    ("4 exact tail programs", {"NKI_KERNELS_TAIL_PROGRAMS": "4"}),
)
SETTINGS = ("NKI_KERNELS_LEAD", "NKI_KERNELS_TAIL_PROFILE", "NKI_KERNELS_TAIL_PROGRAMS")


def serving_loop(lnc: int, steps: int, seed: int = 7) -> tuple:
    """(mean modelled us a step, distinct compile keys) of the loop under the current settings,
    from a clean state (no plans, programs or tail programs kept)."""
    import ml_dtypes
    from nki_kernels import simulate
    from nki_kernels.paged_attention import batch_decode_kernel, batch_prefill, plan_cache
    from nki_kernels.paged_attention import tail_programs
    from nki_kernels.profile import estimate
    P, H, G, D = LAYER["page_size"], LAYER["kv_heads"], LAYER["group"], LAYER["head_dim"]
    rng = np.random.default_rng(seed)
    pages = 2048
    cache = rng.standard_normal((pages, 2, P, H, D)).astype(ml_dtypes.bfloat16)
    plan_cache.clear()
    tail_programs.forget()
    simulate.reset_compile_stats()
    total = 0.0
    for _ in range(steps):
        b = int(rng.integers(9, 17))
        q_lens = rng.integers(65, 97, b)
        kv = np.maximum(q_lens, rng.integers(100, 1600, b))
        npg = -(-kv // P)
        idx = rng.permutation(pages)[:npg.sum()].astype(np.int32)
        kv_indptr = np.concatenate([[0], np.cumsum(npg)]).astype(np.int32)
        last = (kv - (npg - 1) * P).astype(np.int32)
        qo = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
        q = rng.standard_normal((int(qo[-1]), H * G, D)).astype(ml_dtypes.bfloat16)
        with simulate.use_target("trn2"), simulate.tracing() as traces:
            batch_prefill(q, cache, qo, kv_indptr, idx, last, "NHD", causal=True, lnc=lnc)
        total += sum(estimate(t, target="trn2").seconds for t in traces)
    return total / steps * 1e6, len(simulate.compile_keys(batch_decode_kernel))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--policies", nargs="*", help="policy names (default: all)")
    ap.add_argument("--out", default="", help="write prefill_programs.md here")
    args = ap.parse_args(argv)
    lines = [f"| policy | LNC=1: us a step, programs ({args.steps} steps) | LNC=2: us a step, "
             "programs |", "|---|---|---|"]
    for policy, values in POLICIES:
        if args.policies and policy not in args.policies:
            continue
        cells = []
        with settings(values, SETTINGS):
            for lnc in (1, 2):
                us, programs = serving_loop(lnc, args.steps)
                cells.append(f"{us:.1f}, {programs}")
        lines.append(f"| {policy} | {cells[0]} | {cells[1]} |")
        print(lines[-1], flush=True)
    write_table(args.out, "prefill_programs.md", "\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
