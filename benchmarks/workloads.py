"""The serving workload suite: the attention step shapes a chat service runs, each modelled and
set against its floor, instead of one benchmark shape.

    python3 benchmarks/workloads.py [--targets trn2 trn2-lnc2 trn1] [--out benchmarks/results]
        [--only NAME ...] [--env NKI_KERNELS_LEAD=launch ...] [--table workloads.md]

One Llama-3-8B attention layer (8 kv / 32 query heads, head_dim 128, bf16, pages of 16). Each
row: the step's launches modelled (scheduled, the estimate) and how many compiled, the floor
(``profile/floor.py``: the largest of the bytes that must move over HBM bandwidth, the FLOPs over
TensorE peak, one ScalarE and one VectorE pass over the scores; each term shown) and the ratio.
Correctness is the tests' (these shapes run the kernels only, no reference). trn2 at LNC=1 and
LNC=2 (the floor then of both cores), trn1. Each ratio has its band: the same trace with every
uncertain constant at its fastest and slowest plausible value (profile/constants.BANDS).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys

import numpy as np

LAYER = dict(page_size=16, kv_heads=8, group=4, head_dim=128, dtype="bfloat16")

# (workload, kernel, sizes): decode steps (one query per request), verification (q_len drafts, a
# chain or a tree), chunked prefill (a chunk over its prefix), a mixed step (decodes beside a
# chunk), a shared prefix (two cascade levels, and the same keys as plain decode)
SUITE = [
    ("short chat decode 1 x 512", "paged_decode_attention", dict(batch=1, kv_len=512)),
    ("short chat decode 8 x 1024", "paged_decode_attention", dict(batch=8, kv_len=1024)),
    ("short chat decode 32 x 256", "paged_decode_attention", dict(batch=32, kv_len=256)),
    ("short chat decode 64 x 2048", "paged_decode_attention", dict(batch=64, kv_len=2048)),
    ("short chat decode 4 x 100-800 (spread)", "paged_decode_attention",
     dict(batch=4, kv_len=800, kv_min=100)),
    ("short chat decode 12 x 500-620 (spread)", "paged_decode_attention",
     dict(batch=12, kv_len=620, kv_min=500)),
    ("short chat decode 32 x 64-2048 (spread)", "paged_decode_attention",
     dict(batch=32, kv_len=2048, kv_min=64)),
    ("long context decode 1 x 32768", "paged_decode_attention", dict(batch=1, kv_len=32768)),
    ("long context decode 4 x 8192", "paged_decode_attention", dict(batch=4, kv_len=8192)),
    ("long context decode 32 x 4096", "paged_decode_attention", dict(batch=32, kv_len=4096)),
    ("verify 16 x 4 drafts x 1024", "paged_prefill_attention",
     dict(batch=16, q_len=4, kv_len=1024)),
    ("verify 8 x 8 drafts x 2048", "paged_prefill_attention", dict(batch=8, q_len=8, kv_len=2048)),
    ("verify 16 x 4 drafts x 700-1300 (spread)", "paged_prefill_attention",
     dict(batch=16, q_len=4, kv_len=1300, kv_min=700)),
    ("tree verify 8 x 8 drafts x 2048 (custom mask)", "paged_tree_verification",
     dict(batch=8, q_len=8, kv_len=2048)),
    ("chunked prefill 256 over 1k", "paged_prefill_attention",
     dict(batch=1, q_len=256, kv_len=1280)),
    ("chunked prefill 512 over 4k", "paged_prefill_attention",
     dict(batch=1, q_len=512, kv_len=4608)),
    ("chunked prefill 12 x 96 over 100-1000 (spread)", "paged_prefill_attention",
     dict(batch=12, q_len=96, kv_len=1000, kv_min=100)),
    ("mixed: 15 decodes of 1k + chunk 256 over 1k", "paged_prefill_attention",
     dict(batch=15, q_len=1, kv_len=1024, prefill=256, prefill_kv=1280)),
    ("shared prefix: 32 x (4096 shared + 256), cascade", "cascade_attention",
     dict(batch=32, shared=4096, kv_len=256)),
    ("shared prefix without cascade: decode 32 x 4352", "paged_decode_attention",
     dict(batch=32, kv_len=4352)),
]


def run_case(kernel: str, sizes: dict, target: str, lnc: int = 1) -> dict:
    """Model one step (``lnc=2``: over both cores of a trn2 logical core): its launches'
    scheduled time summed, the floor of the cores used and the ratio."""
    from nki_kernels import simulate
    from nki_kernels.profile import estimate
    from nki_kernels.registry import KERNELS
    spec = KERNELS[kernel]
    inputs = spec.make({**LAYER, **sizes}, np.random.default_rng(0))
    if lnc > 1:
        inputs["lnc"] = lnc
    with simulate.use_target(target), simulate.tracing() as traces:
        spec.run(inputs)
    ests = [estimate(t, target=target) for t in traces]
    from nki_kernels.registry import step_floor
    terms = step_floor(spec, inputs, ests[-1].hw, max(e.cores for e in ests))
    floor = terms.seconds
    seconds = sum(e.seconds for e in ests)
    from nki_kernels.profile.sensitivity import band
    low, high = band(list(traces), target, floor)
    return dict(us=seconds * 1e6, floor_us=floor * 1e6, ratio=seconds / floor, low=low,
                high=high, launches=len(ests), terms=terms.terms_us(), bound=terms.bound,
                compilations=sum(1 for t in traces if t.compiled),
                instructions=sum(sum(e.instructions.values()) for e in ests))


def markdown(rows) -> str:
    lines = ["| workload | target | launches (compiled) | instructions | modelled us | "
             "floor us | floor terms us: bytes / FLOPs / ScalarE / VectorE | modelled / floor | "
             "band over assumed constants |", "|" + "---|" * 9]
    for r in rows:
        where = r["target"] + (" LNC=2" if r.get("lnc", 1) > 1 else "")
        lines.append(f"| {r['workload']} | {where} | {r['launches']} ({r['compilations']}) "
                     f"| {r['instructions']} | {r['us']:.1f} | {r['floor_us']:.1f} ({r['bound']}) "
                     f"| {r['terms']} | {r['ratio']:.2f} | {r['low']:.2f}-{r['high']:.2f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--targets", nargs="+", default=["trn2", "trn2-lnc2", "trn1"],
                        help="trn1, trn2, trn2-lnc2 (both cores of a trn2 logical core)")
    parser.add_argument("--out", default=os.path.join("benchmarks", "results"))
    parser.add_argument("--only", nargs="*", help="workloads whose name contains one of these")
    parser.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                        help="a setting the planning reads (NKI_KERNELS_LEAD, _TAIL_PROFILE, "
                             "...), set for this run; repeatable")
    parser.add_argument("--table", default="workloads.md", help="the results file's name")
    args = parser.parse_args(argv)
    values = {}
    for setting in args.env:
        name, eq, value = setting.partition("=")
        if not eq or not name.startswith("NKI_KERNELS_"):
            parser.error(f"--env {setting!r}: expected NKI_KERNELS_<NAME>=<value>")
        values[name] = value
    rows = []
    with settings(values):
        for where in args.targets:
            target, _, lnc = where.partition("-lnc")
            for name, kernel, sizes in SUITE:
                if args.only and not any(o in name for o in args.only):
                    continue
                row = run_case(kernel, sizes, target, int(lnc or 1))
                rows.append(dict(workload=name, target=target, lnc=int(lnc or 1), **row))
                print(f"{name} ({where}): {row['us']:.1f} us, {row['ratio']:.2f}x the floor",
                      flush=True)
    table = markdown(rows)
    if args.env:
        table = f"Settings: {', '.join(args.env)}\n\n{table}"
    print(table)
    write_table(args.out, args.table, table)
    return 0


@contextlib.contextmanager
def settings(values: dict, unset=()):
    """The environment with ``values`` set and the names ``unset`` removed for the block; as it
    was before, after it."""
    saved = {name: os.environ.get(name) for name in set(values) | set(unset)}
    try:
        for name in unset:
            os.environ.pop(name, None)
        os.environ.update(values)
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def write_table(out: str, name: str, table: str):
    """Write a results table to ``out``/``name`` (nothing when ``out`` is empty)."""
    if out:
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, name), "w") as f:
            f.write(table + "\n")


if __name__ == "__main__":
    sys.exit(main())
