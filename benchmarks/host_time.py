"""Host time of the attention entries: what a serving step pays on the CPU before each launch.

    python3 benchmarks/host_time.py [--calls 20] [--out benchmarks/results]

`batch_decode` / `batch_prefill` check their inputs, plan the launch (work items, the sharing
between cores, tails and rounds, the kernel's tables) and pad the arrays to the bucket, on the
host, at every call: a serving engine calling them once per layer pays it once per layer. Each
row times the public entry up to the kernel launch (the launch itself replaced by a stop): the
first call (nothing cached), then the median and the least of ``--calls`` more (the least is
the steadiest on a shared machine); one Llama-3-8B attention layer (8 kv / 32 query heads,
head_dim 128, bf16, pages of 16), trn2. Wall-clock figures: compare runs from one machine.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from workloads import LAYER, write_table  # noqa: E402

# (name, kernel, sizes, with the fused write): decode steps, verification, chunked prefill as
# the replays run it (a dozen requests' chunks of 64 over prefixes of 100-1500 keys, with the
# write of their K/V), a long chunk
CASES = [
    ("decode 32 x 4096", "paged_decode_attention", dict(batch=32, kv_len=4096), False),
    ("decode 32 x 64-2048 (spread)", "paged_decode_attention",
     dict(batch=32, kv_len=2048, kv_min=64), False),
    ("verify 16 x 4 drafts x 1024", "paged_prefill_attention",
     dict(batch=16, q_len=4, kv_len=1024), False),
    ("chunks 12 x 64 over 100-1500, fused write", "paged_prefill_attention",
     dict(batch=12, q_len=64, kv_len=1500, kv_min=100), True),
    ("chunks 4 x 256 over 300-1500, fused write", "paged_prefill_attention",
     dict(batch=4, q_len=256, kv_len=1500, kv_min=300), True),
    ("chunked prefill 512 over 4k", "paged_prefill_attention",
     dict(batch=1, q_len=512, kv_len=4608), False),
]


class _Launched(Exception):
    """Raised in place of the kernel launch: the host's part is done."""


def _stop(*args, **kwargs):
    raise _Launched()


def host_seconds(kernel: str, sizes: dict, fused_write: bool, lnc: int, calls: int):
    """(first call, median and least of ``calls`` more) seconds of host work before the
    launch."""
    from nki_kernels import simulate
    from nki_kernels.paged_attention import api
    from nki_kernels.registry import KERNELS
    spec = KERNELS[kernel]
    inputs = spec.make({**LAYER, **sizes}, np.random.default_rng(0))
    if fused_write:
        q = inputs["q"]
        heads = LAYER["kv_heads"]
        rng = np.random.default_rng(1)
        for name in ("append_key", "append_value"):
            inputs[name] = rng.standard_normal((q.shape[0], heads, q.shape[2])).astype(
                inputs["paged_kv_cache"].dtype)
    if lnc > 1:
        inputs["lnc"] = lnc
    saved = api.run_decode, api.run_prefill
    api.run_decode = api.run_prefill = _stop
    times = []
    try:
        with simulate.use_target("trn2"):
            for _ in range(calls + 1):
                start = time.perf_counter()
                try:
                    spec.run(inputs)
                except _Launched:
                    pass
                times.append(time.perf_counter() - start)
    finally:
        api.run_decode, api.run_prefill = saved
    return times[0], statistics.median(times[1:]), min(times[1:])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--out", default=os.path.join("benchmarks", "results"))
    args = parser.parse_args(argv)
    lines = ["| step (one layer, trn2) | LNC | first call ms | later calls ms: median / least |",
             "|---|---|---|---|"]
    for name, kernel, sizes, fused in CASES:
        for lnc in (1, 2):
            first, median, least = host_seconds(kernel, sizes, fused, lnc, args.calls)
            lines.append(f"| {name} | {lnc} | {first * 1e3:.2f} | {median * 1e3:.2f} / "
                         f"{least * 1e3:.2f} |")
            print(lines[-1], flush=True)
    write_table(args.out, "host_time.md", "\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
