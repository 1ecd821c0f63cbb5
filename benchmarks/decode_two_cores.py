"""Decode on one core vs both cores of a trn2 logical core (LNC=2), in the cost model.

    python3 benchmarks/decode_two_cores.py [--quick]

Cases: one long request (split-KV), a uniform batch, a skewed batch (one long request among short
ones), and the fit behind plan.ITEM_COST_CHUNKS / ITERATION_COST_CHUNKS. Shape: one Llama-3-8B
attention layer (8 kv heads, 32 query heads, head_dim 128, bf16, 16-token pages). Prints a
Markdown table: modelled time per core, the speed-up, and the HBM floor of the cores used.
"""

from __future__ import annotations

import argparse

import ml_dtypes
import numpy as np

from nki_kernels import simulate
from nki_kernels.paged_attention import batch_decode
from nki_kernels.profile import estimate

P, H, G, D = 16, 8, 4, 128
BF16 = ml_dtypes.bfloat16


def _case(rng, lens):
    pages = sum(-(-n // P) for n in lens) + 8
    cache = rng.standard_normal((pages, 2, P, H, D)).astype(BF16)
    counts = [-(-n // P) for n in lens]
    idx = rng.permutation(pages)[:sum(counts)].astype(np.int32)
    indptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    last = np.array([(n - 1) % P + 1 if n else 0 for n in lens], np.int32)
    q = rng.standard_normal((len(lens), H * G, D)).astype(BF16)
    return q, cache, indptr, idx, last, "NHD"


def _run(args, lnc):
    with simulate.use_target("trn2"):
        batch_decode(*args, lnc=lnc)
        est = estimate(simulate.last_trace())
    return est


def compare(name, lens, rng):
    args = _case(rng, lens)
    one, two = _run(args, 1), _run(args, 2)
    cores = " / ".join(f"{two.core_seconds(c) * 1e6:.0f}" for c in range(two.cores))
    return (f"| {name} | {one.seconds * 1e6:.0f} | {cores} | {one.seconds / two.seconds:.2f} "
            f"| {one.hbm_floor_seconds * 1e6:.0f} / {two.hbm_floor_seconds * 1e6:.0f} "
            f"| {two.hbm_bytes / one.hbm_bytes:.3f} |")


def _counts(lens):
    """(work items, loop iterations, chunks) of a one-core decode step over requests ``lens``."""
    from nki_kernels.buckets import bucket
    from nki_kernels.paged_attention.work import (ITEM_CLASSES, decode_work,
                                                         items_per_iteration, loop_widths,
                                                         span_column)
    lens = np.array(lens)
    indptr = np.concatenate([[0], np.cumsum(-(-lens // P))])
    rows = bucket(len(lens))
    U = items_per_iteration(1)
    span = decode_work(indptr, lens, -1, P, rows).spans[0]
    items = iterations = 0
    for kind in range(len(ITEM_CLASSES)):
        for w in loop_widths(U):
            col = span_column(kind, w, U)
            items += int(span[col + 1] - span[col])
            iterations += int(span[col + 1] - span[col]) // w
    return items, iterations, int((-(-lens // 128)).sum())


def fit(rng):
    """Per-item and per-loop-iteration cost in chunk-equivalents (LNC=1): least squares of the
    modelled time over batches mixing request lengths, so blocks and single chunks all occur."""
    cases = [[128 * 64], [128 * 16] * 4, [128] * 32, [128 * 12] * 4, [128 * 3] * 8,
             [128 * 20] * 2, [128 * 7] * 6, [128 * 5 + 9] * 16, [128 * 33] * 3]
    rows, times = [], []
    for lens in cases:
        rows.append(list(_counts(lens)))
        times.append(_run(_case(rng, lens), 1).seconds)
    (item, iteration, chunk), *_ = np.linalg.lstsq(np.array(rows, float), np.array(times),
                                                   rcond=None)
    return item / chunk, iteration / chunk


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--quick", action="store_true", help="smaller lengths (a minute)")
    a = p.parse_args(argv)
    rng = np.random.default_rng(0)
    scale = 4 if a.quick else 1
    cases = [("batch 1 x 32768 (split-KV)", [32768 // scale]),
             ("batch 32 x 4096", [4096 // scale] * 32),
             ("batch 16: one 16384 + 15 x 512", [16384 // scale] + [512 // scale] * 15),
             ("batch 8 mixed 100..3000", [3000 // scale, 100, 1700 // scale, 640, 2900 // scale,
                                          260, 1200 // scale, 90])]
    print("| case | LNC=1 us | LNC=2 us per core | speed-up | HBM floor us (1 / 2 cores) "
          "| bytes LNC=2 / LNC=1 |")
    print("|---|---|---|---|---|---|")
    for name, lens in cases:
        print(compare(name, lens, rng), flush=True)
    item, iteration = fit(rng)
    print(f"\nfit (LNC=1): a work item costs {item:.2f} chunks, a loop iteration {iteration:.2f} "
          f"(plan.ITEM_COST_CHUNKS, plan.ITERATION_COST_CHUNKS)")


if __name__ == "__main__":
    main()
