"""The fit behind ``work.UNIT_LOOP_TILE_CHUNKS`` / ``WHOLE_ITERATION_TILE_CHUNKS``: how one
core's end in an LNC=2 prefill launch of whole units follows its units' chunks, their own loop
iterations (``work.whole_unit_loops``) and its iterations over units.

    python3 benchmarks/whole_halves.py [--sharings 8] [--seed 1]

Replays the llama8b preset's chunked prefill (chunks of 64, 128 and 256 tokens, LNC=2) and
keeps some steps' prefill launches; runs each again with ``--sharings`` random sharings of its
units between the cores (each core at least the lead units), and fits by least squares, with an
intercept per launch, end = a * tile-chunks + b * unit loop iterations + c * iterations over
units (cost model, trn2). Prints the coefficients, each against a tile-chunk, and the rms.
"""

from __future__ import annotations

import argparse

import numpy as np

from nki_kernels import simulate
from nki_kernels import paged_attention as pa
from nki_kernels.paged_attention import work
from nki_kernels.profile.cost_model import estimate
from query_blocks import record_launches  # noqa: E402  (benchmarks/ is the script's path)

STEPS = {64: (10, 16, 18, 24), 128: (8, 14, 20), 256: (6, 12)}


def core_ends(launch, ones_of):
    """Run a launch ``record_launches`` kept with the sharing ``ones_of(B, least)`` gives; per
    core: (end us, units, chunks, unit loops), and the unit tiles and group size."""
    q, cache, qo, table, kwargs = launch
    seen = {}
    halves = work._whole_halves

    def forced(chunks, kinds, U, pad, group_units=1, unit_tiles=None, least=0, unit_loops=None):
        ones = ones_of(len(chunks), least)
        seen.update(chunks=np.asarray(chunks), loops=np.asarray(unit_loops), ones=ones,
                    tiles=unit_tiles, group=group_units)
        return ones, (0.0, 0.0)
    work._whole_halves = forced
    try:
        with simulate.use_target("trn2"), simulate.tracing() as traces:   # the fused write
            pa.batch_prefill(q, cache.copy(), qo, *table, **kwargs)       # goes to a copy
    finally:
        work._whole_halves = halves
    prefill = [t for t in traces if t.loops][-1]     # the chunks' launch, not the decode one
    slots = estimate(prefill, "trn2").schedule.slots
    out = []
    for core in (0, 1):
        mine = seen["ones"] == core
        end = max(s.end for s in slots if s.core == core) * 1e6
        out.append((end, int(mine.sum()), float(seen["chunks"][mine].sum()),
                    float(seen["loops"][mine].sum())))
    return out, seen["tiles"], seen["group"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sharings", type=int, default=8)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    rng = np.random.default_rng(a.seed)

    def random_ones(B, least):
        while True:
            ones = rng.integers(0, 2, B)
            ones[0] = 0
            if max(1, least) <= ones.sum() <= B - max(1, least):
                return ones
    rows, ends, launch_of = [], [], []
    for chunk, steps in STEPS.items():
        for k, launch in enumerate(record_launches(chunk, max(steps) + 1, 2, set(steps))):
            for _ in range(a.sharings):
                cores, tiles, group = core_ends(launch, random_ones)
                for end, units, chunks, loops in cores:
                    rows.append([tiles * chunks, loops,
                                 float(work.group_iterations(np.array([units]), group)[0])])
                    ends.append(end)
                    launch_of.append(f"{chunk}:{k}")
    names = sorted(set(launch_of))
    X = np.hstack([np.array([[float(n == m) for m in names] for n in launch_of]),
                   np.array(rows)])
    coef, *_ = np.linalg.lstsq(X, np.array(ends), rcond=None)
    rms = float(np.sqrt(np.mean((np.array(ends) - X @ coef) ** 2)))
    tile, loop, group = coef[-3:]
    print(f"{len(ends)} core ends over {len(names)} launches: a tile-chunk {tile:.3f} us, a unit "
          f"loop iteration {loop:.1f} us ({loop / tile:.0f} tile-chunks), an iteration over "
          f"units {group:.1f} us ({group / tile:.0f}); rms {rms:.1f} us")


if __name__ == "__main__":
    main()
