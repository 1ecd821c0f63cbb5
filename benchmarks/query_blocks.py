"""Fit and check the prefill launches' query-block policy (``plan.prefill_query_block``).

Replays chunked-prefill traces (``nki-kernels serve --preset llama8b --prefill-chunk N``), and
for every launch of blocks of queries models it with each candidate block (the largest
``query_block`` allows, then half as many tiles, ... down to one tile). Fits the policy's three
constants (a score tile over a chunk, a byte an item gathers, an item) by least squares on the
differences between a launch's candidates, and reports per trace the launches' total with the
largest block, with the policy's pick (the constants in ``plan.py``, and the fitted ones) and
with the best candidate of each launch, and the policy's bytes against the largest block's.

    python3 benchmarks/query_blocks.py [--chunks 64 128 256 512] [--steps 32] [--lnc 1]
"""

from __future__ import annotations

import argparse
import dataclasses

import numpy as np

import nki_kernels.paged_attention as attention
from nki_kernels import serve, simulate
from nki_kernels.paged_attention import plan
from nki_kernels.paged_attention.work import whole_units
from nki_kernels.profile.cost_model import estimate


def record_launches(chunk, steps, lnc, keep=None):
    """The replay's batch_prefill calls (inputs, the cache cut to the pages they reference);
    ``keep``: only those of these steps (0-based)."""
    real, calls, seen = attention.batch_prefill, [], [0]

    def recording(q, cache, qo, kv_indptr, kv_indices, last, **kw):
        if keep is None or seen[0] in keep:
            used = np.asarray(kv_indices[:int(kv_indptr[-1])])
            calls.append((q.copy(), cache[used].copy(), qo.copy(),
                          (np.asarray(kv_indptr).copy(), np.arange(used.size, dtype=np.int32),
                           np.asarray(last).copy()), dict(kw)))
        seen[0] += 1
        return real(q, cache, qo, kv_indptr, kv_indices, last, **kw)
    attention.batch_prefill = recording
    try:
        cfg = dataclasses.replace(serve.PRESETS["llama8b"], steps=steps, prefill_chunk=chunk,
                                  lnc=lnc)
        serve.replay(cfg, "trn2", check=False)
    finally:
        attention.batch_prefill = real
    return calls


def features(q_lens, table, qb, cfg, kv_bytes):
    """``plan.query_block_terms`` of the launch's requests of more than one query (the others
    run as decode) in blocks of qb."""
    indptr, _, last = table
    pages = np.diff(indptr)
    kv = np.where(pages > 0, (pages - 1) * cfg.page_size + last, 0)
    prompt = q_lens > 1
    ptr = np.concatenate([[0], np.cumsum(pages[prompt])])
    return plan.query_block_terms(ptr, kv[prompt], q_lens[prompt], qb, -1, True, cfg.page_size,
                                  cfg.kv_heads, cfg.group, cfg.head_dim, kv_bytes)


def step_keys(table, cfg):
    indptr, _, last = table
    pages = np.diff(indptr)
    return int(np.where(pages > 0, (pages - 1) * cfg.page_size + last, 0).sum())


def measure(calls, cfg, lnc):
    """Per launch of whole units: [(qb, modelled s, bytes, features, step keys)] over the
    policy's candidates (``plan.query_block_candidates``), each forced in turn."""
    run, policy, out = attention.batch_prefill, plan.prefill_query_block, []
    for q, cache, qo, table, kw in calls:
        q_lens = np.diff(qo)
        top = plan.query_block(int(q_lens.max()), cfg.group, cfg.kv_heads, cfg.head_dim, lnc)
        if q_lens.max() <= 1 or not whole_units(top):      # decode, or a flat list: no choice
            continue
        rows = []
        for qb in plan.query_block_candidates(top, cfg.group):
            plan.prefill_query_block = lambda *a, _qb=qb, **k: _qb
            try:
                with simulate.use_target("trn2"), simulate.tracing() as traces:
                    run(q, cache.copy(), qo, *table, **kw)
            finally:
                plan.prefill_query_block = policy
            rows.append((qb, estimate(traces[0], "trn2").seconds, traces[0].hbm_bytes,
                         features(q_lens, table, qb, cfg, cache.dtype.itemsize),
                         step_keys(table, cfg)))
        out.append(rows)
    return out


def fit(launches):
    """Least squares of the candidates' differences from each launch's first."""
    dx, dy = [], []
    for rows in launches:
        for qb, s, _, f, _ in rows[1:]:
            dx.append((f - rows[0][3])[:3])
            dy.append(s - rows[0][1])
    if not dx:
        return None
    return np.linalg.lstsq(np.array(dx), np.array(dy), rcond=None)[0]


def totals(launches, coef):
    """(largest block's seconds, the policy's, the best candidate's, policy bytes / largest's):
    each launch's pick by ``plan.pick_query_block`` under ``coef``."""
    pick = []
    for rows in launches:
        by_qb = {r[0]: r for r in rows}
        qb = plan.pick_query_block(list(by_qb), lambda b: by_qb[b][3], rows[0][4], coef)
        pick.append(by_qb[qb])
    return (sum(rows[0][1] for rows in launches), sum(p[1] for p in pick),
            sum(min(r[1] for r in rows) for rows in launches),
            sum(p[2] for p in pick) / max(1, sum(rows[0][2] for rows in launches)))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--chunks", type=int, nargs="+", default=[64, 128, 256, 512])
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--lnc", type=int, default=1, choices=(1, 2))
    args = ap.parse_args(argv)
    cfg = serve.PRESETS["llama8b"]
    ours = np.array(plan.QB_COSTS)
    per_trace = {}
    for chunk in args.chunks:
        per_trace[chunk] = measure(record_launches(chunk, args.steps, args.lnc), cfg, args.lnc)
    fitted = fit([rows for launches in per_trace.values() for rows in launches])
    print(f"constants in plan.py: tile x chunk {ours[0] * 1e6:.3f} us, chunk "
          f"{ours[1] * 2 * 128 * cfg.kv_heads * cfg.head_dim * 2 * 1e6:.2f} us, item "
          f"{ours[2] * 1e6:.2f} us")
    if fitted is not None:
        print(f"fitted: tile x chunk {fitted[0] * 1e6:.3f} us, chunk "
              f"{fitted[1] * 2 * 128 * cfg.kv_heads * cfg.head_dim * 2 * 1e6:.2f} us, item "
              f"{fitted[2] * 1e6:.2f} us")
    print("| chunk | launches | largest block us | policy us | fitted us | best us | "
          "policy bytes / largest's |")
    print("|---|---|---|---|---|---|---|")
    for chunk, launches in per_trace.items():
        base, pol, best, nbytes = totals(launches, ours)
        fit_us = totals(launches, fitted)[1] if fitted is not None else float("nan")
        print(f"| {chunk} | {len(launches)} | {base * 1e6:.0f} | {pol * 1e6:.0f} | "
              f"{fit_us * 1e6:.0f} | {best * 1e6:.0f} | {nbytes:.3f} |")


if __name__ == "__main__":
    main()
