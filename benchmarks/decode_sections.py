"""Decode static passes in sections: the fixed menu against one section and any split.

    python3 benchmarks/decode_sections.py [--out benchmarks/results]

A decode bucket's static pass may run its shorter rows with fewer chunk slots, in sections
chosen from ``work.STATIC_SECTION_TEMPLATES`` (``NKI_KERNELS_STATIC_SECTIONS`` unset); ``1``
keeps one section, ``any`` weighs every split. Each split is a static argument, so a split
met is a compile. For each mode: the modelled time (trn2, LNC=1 and LNC=2, one Llama-3-8B
layer) summed over twelve spread batches (3-40 requests of 50-4096 keys) and three of one
~4000-key request among short ones, and the decode programs a random-mix serving loop plans
(host planning only: 120 steps of 5-7 requests of 100-900 keys, a fresh mix each step).
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from workloads import LAYER, settings, write_table  # noqa: E402

MODES = (("one section", "1"), ("the menu (default)", None), ("any split", "any"))
ENV = "NKI_KERNELS_STATIC_SECTIONS"


def batches(seed=52):
    """(kind, keys per request) of the modelled decode steps."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(12):
        B = int(rng.integers(3, 41))
        out.append(("spread", [int(x) for x in rng.integers(50, 4097, B)]))
    for B in (6, 8, 12):
        out.append(("long among short", [4000] + [int(x) for x in rng.integers(60, 500, B - 1)]))
    return out


def modelled_us(lens, lnc: int) -> float:
    """One decode step of requests of ``lens`` keys, modelled on trn2 (us)."""
    from nki_kernels import registry, simulate
    from nki_kernels.paged_attention import plan_cache
    from nki_kernels.profile import estimate
    plan_cache.clear()
    inputs = registry._paged_case({**LAYER, "batch": len(lens), "kv_len": max(lens)},
                                  np.random.default_rng(0), [1] * len(lens), lens)
    inputs["lnc"] = lnc
    with simulate.use_target("trn2"), simulate.tracing() as traces:
        registry.KERNELS["paged_decode_attention"].run(inputs)
    return sum(estimate(t, target="trn2").seconds for t in traces) * 1e6


def loop_programs(cores: int, steps: int = 120, seed: int = 7) -> int:
    """Distinct decode programs (bucket, static arguments) a random-mix loop plans."""
    from nki_kernels import simulate
    from nki_kernels.buckets import bucket
    from nki_kernels.paged_attention import plan
    H, G, D, P = LAYER["kv_heads"], LAYER["group"], LAYER["head_dim"], LAYER["page_size"]
    cache = np.zeros((2000, 2, P, H, D), np.float32)
    rng = np.random.default_rng(seed)
    seen = set()
    for _ in range(steps):
        lens = rng.integers(100, 900, int(rng.integers(5, 8)))
        pages = -(-lens // P)
        indptr = np.concatenate([[0], np.cumsum(pages)]).astype(np.int32)
        last = (lens - (pages - 1) * P).astype(np.int32)
        q = np.zeros((lens.size, H * G, D), np.float32)
        with simulate.use_target("trn2"):
            launch = plan.prepare_decode(q, cache, indptr, np.arange(indptr[-1], dtype=np.int32),
                                         last, "NHD", None, 0.0, -1, None, 1.0, 1.0, cores)
        seen.add((bucket(lens.size), repr(launch.statics)))
    return len(seen)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="", help="write decode_sections.md here")
    args = ap.parse_args(argv)
    steps = batches()
    lines = ["| sections | spread, LNC=1 / LNC=2 (us) | long among short, LNC=1 / LNC=2 (us) "
             "| loop programs, LNC=1 / LNC=2 |", "|---|---|---|---|"]
    for name, value in MODES:
        with settings({} if value is None else {ENV: value}, (ENV,)):
            total = {}
            for kind, lens in steps:
                for lnc in (1, 2):
                    total[kind, lnc] = total.get((kind, lnc), 0.0) + modelled_us(lens, lnc)
            programs = [loop_programs(c) for c in (1, 2)]
            lines.append(f"| {name} | {total['spread', 1]:.1f} / {total['spread', 2]:.1f} | "
                         f"{total['long among short', 1]:.1f} / "
                         f"{total['long among short', 2]:.1f} | {programs[0]} / {programs[1]} |")
        print(lines[-1], flush=True)
    write_table(args.out, "decode_sections.md", "\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
