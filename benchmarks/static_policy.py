"""The static-pass policy (work.static_pass) against running every step both ways.

    python3 benchmarks/static_policy.py [--quick] [--lnc 1|2]

Each decode step of a grid (1-32 requests of 128-4096 keys, uniform, spread 8x and within a
fifth; trn2, LNC=1 and 2; one Llama-3-8B layer) is modelled as a static pass and as device
loops. Prints each step's two times and the policy's pick, then the per-row and per-slot costs
(chunk-equivalents) that would have picked best over the grid: the fit behind
work.STATIC_ROW_COST_CHUNKS and STATIC_SLOT_COST_CHUNKS.
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from workloads import LAYER, run_case  # noqa: E402

from nki_kernels.buckets import bucket  # noqa: E402
from nki_kernels.paged_attention import plan, work  # noqa: E402
from nki_kernels.registry import KERNELS  # noqa: E402


def grid(quick=False, cores=(1, 2)):
    """(sizes, lnc) of every step tried."""
    batches, lens = ((1, 4, 16), (512, 2048)) if quick else ((1, 2, 4, 8, 12, 16, 24, 32),
                                                             (128, 256, 384, 512, 700, 1024,
                                                              2048, 4096))
    out = []
    for lnc in cores:
        for b in batches:
            for n in lens:
                out.append((dict(batch=b, kv_len=n), lnc))
                if b > 1:           # spread 8x, and within a fifth
                    out.append((dict(batch=b, kv_len=n, kv_min=max(16, n // 8)), lnc))
                    out.append((dict(batch=b, kv_len=n, kv_min=n * 4 // 5), lnc))
    return out


def _forced(mode):
    """plan.static_pass replaced: "static" whenever a static pass can run, "loops" never."""
    policy = work.static_pass

    def static_pass(req, page_size, batch_rows, cores=1, nc_version=3, chunk_bytes=0,
                    row_bytes=0, pack=1):
        if mode == "loops":
            return 0
        row, slot = work.STATIC_ROW_COST_CHUNKS, work.STATIC_SLOT_COST_CHUNKS
        work.STATIC_ROW_COST_CHUNKS, work.STATIC_SLOT_COST_CHUNKS = -1e9, 0.0
        try:
            return policy(req, page_size, batch_rows, cores, nc_version, chunk_bytes, row_bytes,
                          pack)
        finally:
            work.STATIC_ROW_COST_CHUNKS, work.STATIC_SLOT_COST_CHUNKS = row, slot
    return static_pass


def policy_terms(sizes, lnc):
    """``work.static_terms`` of the suite's decode step of ``sizes`` on ``lnc`` cores."""
    inputs = KERNELS["paged_decode_attention"].make({**LAYER, **sizes}, np.random.default_rng(0))
    indptr, last = inputs["kv_indptr"].astype(np.int32), inputs["kv_last_page_len"]
    pages = np.diff(indptr)
    lens = np.where(pages > 0, (pages - 1) * LAYER["page_size"] + last, 0).astype(np.int32)
    req = work.query_blocks(indptr, lens, np.ones_like(lens), 1, -1, True, LAYER["page_size"])
    return work.static_terms(req, bucket(sizes["batch"]), lnc)


def picked(steps, row, slot):
    """Total time of the steps with the static pass taken where its ``work.static_cost`` (rows
    x (row + chunks x slot), packed requests sharing some of it, plus the split's exchange) is
    below the loops' cost."""
    total = 0.0
    for _, _, static_us, loops_us, (looped, rows, chunks, split) in steps:
        pack = work.static_pack(rows, LAYER["kv_heads"], LAYER["group"])   # bf16
        cost = work.static_cost(rows, chunks, split, row, slot, pack=pack)
        total += static_us if cost < looped else loops_us
    return total


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a small grid")
    ap.add_argument("--lnc", type=int, choices=(1, 2), help="only this LNC")
    args = ap.parse_args(argv)
    policy, steps = plan.static_pass, []
    print("| step | LNC | static us | loops us | policy |\n|---|---|---|---|---|")
    try:
        for sizes, lnc in grid(args.quick, (args.lnc,) if args.lnc else (1, 2)):
            times = {}
            for mode in ("static", "loops"):
                plan.static_pass = _forced(mode)
                times[mode] = run_case("paged_decode_attention", sizes, "trn2", lnc)["us"]
            if abs(times["static"] - times["loops"]) < 1e-9:
                continue                              # past the static pass's limits
            terms = policy_terms(sizes, lnc)
            steps.append((sizes, lnc, times["static"], times["loops"], terms))
            pick = picked(steps[-1:], work.STATIC_ROW_COST_CHUNKS, work.STATIC_SLOT_COST_CHUNKS)
            print(f"| {sizes} | {lnc} | {times['static']:.1f} | {times['loops']:.1f} | "
                  f"{'static' if pick == times['static'] else 'loops'} |")
    finally:
        plan.static_pass = policy
    best = sum(min(s[2], s[3]) for s in steps)
    now = picked(steps, work.STATIC_ROW_COST_CHUNKS, work.STATIC_SLOT_COST_CHUNKS)
    fits = sorted((picked(steps, r, s), r, s) for r in np.arange(0.0, 8.01, 0.5)
                  for s in np.arange(0.4, 2.01, 0.1))
    print(f"\n{len(steps)} steps: the better of each {best:.1f} us, the policy's picks {now:.1f} "
          f"(row {work.STATIC_ROW_COST_CHUNKS}, slot {work.STATIC_SLOT_COST_CHUNKS}); best fit "
          f"{fits[0][0]:.1f} at row {fits[0][1]:.1f}, slot {fits[0][2]:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
