"""The fit behind how a decode static pass picks its split (work.SECTION_SLOT_SHARE and
STATIC_SECTION_COST_CHUNKS): every split of the menu modelled on the replays' decode launches.

    python3 benchmarks/section_fit.py [--replays 64:1 64:2 128:1 0:1] [--steps 32]

Each replay (``nki-kernels serve --preset llama8b``; ``chunk:lnc``, chunk 0 unchunked) is run
with the planner's split choices recorded; each distinct decode launch is then rebuilt as a
``batch_decode`` step of the same lengths (trn2, one Llama-3-8B layer) and modelled once per
split of ``work.static_pass_menu`` (one section included). Printed: the time of the proxy's
picks against the best split's, then over a grid of (row cost, packed slot share, section
cost) the picks' time, best first.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from decode_sections import modelled_us  # noqa: E402
from workloads import LAYER  # noqa: E402

from nki_kernels.paged_attention import plan, work  # noqa: E402


def launches(chunk: int, lnc: int, steps: int) -> list:
    """(keys per request, bucket rows, cores, chunks, pack) of each decode static pass in
    sections a replay plans (windowless)."""
    from nki_kernels.serve import PRESETS, replay
    seen = []
    chosen = plan.static_sections

    def spy(req, batch_rows, cores, chunks, pack=1):
        if not (req.W > 0).any():
            seen.append(([int(x) for x in req.L], batch_rows, cores, chunks, pack))
        return chosen(req, batch_rows, cores, chunks, pack)
    cfg = dataclasses.replace(PRESETS["llama8b"], lnc=lnc, steps=steps,
                              **({"prefill_chunk": chunk} if chunk else {}))
    plan.static_sections = spy
    try:
        replay(cfg, "trn2")
    finally:
        plan.static_sections = chosen
    return list(dict.fromkeys((tuple(L),) + tuple(rest) for L, *rest in seen))


def splits(lens, rows, cores, chunks, pack) -> list:
    """Every split of the menu the step's requests fit (``work.section_options``): [(sizes,
    counts)], one section first."""
    page = LAYER["page_size"]
    L = np.asarray(lens)
    indptr = np.concatenate([[0], np.cumsum(-(-L // page))])
    req = work.query_blocks(indptr, L, np.ones_like(L), 1, -1, True, page)
    return list(work.section_options(req, rows, cores, chunks, pack))


def modelled_split(lens, cores, sizes, counts) -> float:
    """One decode step modelled with its static pass forced to this split."""
    chosen = plan.static_sections
    forced = () if len(sizes) == 1 else tuple(zip(sizes, counts))
    plan.static_sections = lambda *a, **k: forced
    try:
        return modelled_us(list(lens), cores)
    finally:
        plan.static_sections = chosen


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--replays", nargs="+", default=["64:1", "64:2", "128:1", "0:1"])
    ap.add_argument("--steps", type=int, default=32)
    args = ap.parse_args(argv)
    table = []          # per launch: [(sizes, counts, pack, us)]
    for spec in args.replays:
        chunk, lnc = (int(x) for x in spec.split(":"))
        for lens, rows, cores, chunks, pack in launches(chunk, lnc, args.steps):
            options = [(s, c, pack, modelled_split(lens, cores, s, c))
                       for s, c in splits(lens, rows, cores, chunks, pack)]
            table.append(options)
        print(f"replay {spec}: {len(table)} launches so far", flush=True)
    best = sum(min(o[3] for o in opts) for opts in table)

    def picks(row, share, section):
        return sum(min(opts, key=lambda o: (work.split_cost(o[0], o[1], o[2], share, section,
                                                            row), len(o[0])))[3]
                   for opts in table)
    now = picks(work.STATIC_ROW_COST_CHUNKS, work.SECTION_SLOT_SHARE,
                work.STATIC_SECTION_COST_CHUNKS)
    print(f"{len(table)} launches: the current picks {now:.1f} us, the best splits {best:.1f} "
          f"({now / best:.4f}x)")
    grid = [(picks(r, s, c), r, s, c) for r, s, c in
            itertools.product((0.5, 1.0, 2.25, 4.5), (0.0, 0.25, 0.5), (0.0, 1.0, 2.0, 4.0))]
    for us, r, s, c in sorted(grid)[:10]:
        print(f"  row {r}, packed slot share {s}, section {c}: {us:.1f} us ({us / best:.4f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
