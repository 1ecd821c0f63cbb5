"""How much work each device-loop iteration should carry, by the scheduled cost model.

    python3 benchmarks/loop_blocks.py

A loop iteration costs a ~9 us barrier (nki_kernels/profile), so the kernels issue several units
per iteration: decode chunks in blocks (paged_decode_attention.plan.CHUNK_BLOCKS), append tiles or
tokens in blocks (paged_kv_append.kernel.TILES_PER_ITERATION). This sweeps the block sizes on
trn2 (decode: batch 8 x 4096 tokens and batch 32 x 300, bf16, 8 kv heads x 4, D 128, pages of
16; append: 1024 prompt tokens) and prints the scheduled time, the program size and the loop
iterations, so the defaults can be read off the table.
"""

from __future__ import annotations

import sys

import numpy as np

from nki_kernels import simulate
from nki_kernels.paged_attention import kernel as decode_kernel
from nki_kernels.paged_attention import plan
from nki_kernels.paged_kv_append import kernel as append_kernel
from nki_kernels.profile import estimate

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from decode_two_cores import _case, _run  # noqa: E402


def _set_blocks(blocks):
    """Mask-free block sizes of a work item (largest first, the rest halving down to 1)."""
    decode_kernel.CHUNK_BLOCKS = plan.CHUNK_BLOCKS = blocks
    decode_kernel.ITEM_CLASSES = plan.ITEM_CLASSES = (((0, False), (1, True))
                                                      + tuple((b, False) for b in blocks))


def decode_row(blocks, lens, rng):
    _set_blocks(blocks)
    simulate.reset_compile_stats()
    est = _run(_case(rng, lens), 1)
    trace = simulate.last_trace()
    return est.seconds, trace.program_instructions, sum(est.schedule.barriers.values())


def append_row(per_tile, tokens, rng):
    from nki_kernels.paged_kv_append.api import reshape_and_cache
    append_kernel.TILES_PER_ITERATION = per_tile
    simulate.reset_compile_stats()
    H, D, N, P = 8, 128, 512, 16
    kc = np.zeros((N, P, H, D), np.float32)
    vc = kc.copy()
    key = rng.standard_normal((tokens, H, D)).astype(np.float32)
    with simulate.use_target("trn2"):
        reshape_and_cache(key, key, kc, vc, rng.permutation(N * P)[:tokens])
    est = estimate(simulate.last_trace())
    return est.seconds, simulate.last_trace().program_instructions, \
        sum(est.schedule.barriers.values())


def main():
    rng = np.random.default_rng(0)
    saved = plan.CHUNK_BLOCKS, append_kernel.TILES_PER_ITERATION
    try:
        print("| decode chunk blocks | 8 x 4096: us | program | iterations "
              "| 32 x 300: us | program | iterations |")
        print("|---|---|---|---|---|---|---|")
        for top in (1, 4, 8, 16, 32, 64):
            blocks = tuple(top >> k for k in range(top.bit_length()))
            a = decode_row(blocks, [4096] * 8, rng)
            b = decode_row(blocks, [300] * 32, rng)
            print(f"| {blocks} | {a[0] * 1e6:.0f} | {a[1]} | {a[2]} | {b[0] * 1e6:.0f} | {b[1]} "
                  f"| {b[2]} |", flush=True)
        print("\n| append tiles per iteration (1024 tokens) | us | program | iterations |")
        print("|---|---|---|---|")
        for per in (1, 2, 4, 8):
            t, prog, it = append_row(per, 1024, rng)
            print(f"| {per} | {t * 1e6:.1f} | {prog} | {it} |", flush=True)
    finally:
        _set_blocks(saved[0])
        append_kernel.TILES_PER_ITERATION = saved[1]


if __name__ == "__main__":
    main()
