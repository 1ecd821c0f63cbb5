"""How many append tiles each device-loop iteration should carry, by the scheduled cost model.

    python3 benchmarks/loop_blocks.py

A loop iteration costs a ~9 us barrier (nki_kernels/profile), so the append kernel issues its
128-token tiles in blocks (paged_kv_append.kernel.TILES_PER_ITERATION); a bucket of at most that
many tiles runs without a loop, its padding tiles costing their DMA issue. This sweeps the block
size on trn2 (8 kv heads x 128, bf16; split and fused caches; appends of 300, 1024 and 3300
tokens, in buckets of 512, 1024 and 4096) and prints the scheduled time, the program size and
the loop iterations, so the default can be read off the table.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from nki_kernels import simulate
from nki_kernels.paged_kv_append import kernel as append_kernel
from nki_kernels.paged_kv_append.api import reshape_and_cache
from nki_kernels.profile import estimate

H, D, P, PAGES = 8, 128, 16, 512
TOKENS = (300, 1024, 3300)
BLOCKS = (1, 2, 4, 8, 16, 32)


def append_row(per_tile, tokens, fused, rng):
    """(seconds, program instructions, loop iterations) of one append of ``tokens`` rows."""
    append_kernel.TILES_PER_ITERATION = per_tile
    simulate.reset_compile_stats()                  # a new block size is a new program
    cache = np.zeros((PAGES, 2, P, H, D), ml_dtypes.bfloat16)
    kc, vc = (cache, None) if fused else (cache[:, 0].copy(), cache[:, 1].copy())
    key = rng.standard_normal((tokens, H, D)).astype(ml_dtypes.bfloat16)
    with simulate.use_target("trn2"):
        reshape_and_cache(key, key, kc, vc, rng.permutation(PAGES * P)[:tokens])
    trace = simulate.last_trace()
    est = estimate(trace)
    return est.seconds, trace.program_instructions, sum(est.schedule.barriers.values())


def main():
    rng = np.random.default_rng(0)
    saved = append_kernel.TILES_PER_ITERATION
    try:
        print("| cache | tiles per iteration | "
              + " | ".join(f"{n} tokens: us / program / iterations" for n in TOKENS) + " |")
        print("|---|---|" + "---|" * len(TOKENS))
        for fused in (False, True):
            for per in BLOCKS:
                cells = []
                for n in TOKENS:
                    t, prog, it = append_row(per, n, fused, rng)
                    cells.append(f"{t * 1e6:.1f} / {prog} / {it}")
                print(f"| {'fused' if fused else 'split'} | {per} | " + " | ".join(cells) + " |",
                      flush=True)
    finally:
        append_kernel.TILES_PER_ITERATION = saved


if __name__ == "__main__":
    main()
