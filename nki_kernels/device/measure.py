"""Measured latency of the kernels on a NeuronCore, through ``nki.benchmark``: each host entry
is run once while its launches are recorded (``launches.recording``), its output checked against
the reference, then every launch benchmarked on its own (warm-up, iterations, percentiles,
NEFF and NTFF files); a row's latency is the sum over its launches.

``measured.json``: {"target", "backend", "warmup", "iters", "rows": [{kernel, sizes, variant,
ok, max_err, launches, p50_us, p90_us, p99_us, per_launch: [...], neff, ntff, modelled_us}]}:
what ``calibrate --fit`` reads (it re-runs each row's sizes in the simulator to get its
instructions).
"""

from __future__ import annotations

import json
import os
import time

from nki_kernels.registry import KERNELS

from .launches import recording
from .validate import run_case

PERCENTILES = (50, 90, 99)


# Small shapes beside the demo sizes in a quick run, so each fitted constant has rows that lean
# on it: single-row indirect DMAs (software DGE), an HND append (many short runs), long device
# loops (the barrier), a prefill chunk.
QUICK_EXTRA = (("tensor_scatter", dict(seq_len=1, mode="linear")),
               ("paged_kv_append", dict(layout="HND", append=1)),
               ("paged_decode_attention", dict(batch=2, kv_len=2000)),
               ("paged_prefill_attention", dict(batch=1, q_len=64, kv_len=700, prefill=0)))


def bench_rows(quick: bool):
    """(kernel, sizes, variant) of the bench: the modelled bench's rows (realistic sizes and
    variants), or with ``quick`` each kernel at its demo sizes and a few more small shapes
    (``QUICK_EXTRA``; a minute or two in the rehearsal)."""
    rows = []
    for name, spec in KERNELS.items():
        if quick:
            rows.append((name, dict(spec.demo), {}))
            continue
        for variant in spec.variants:
            rows.append((name, dict(spec.bench, **variant), dict(variant)))
    if quick:
        for name, variant in QUICK_EXTRA:
            rows.append((name, dict(KERNELS[name].demo, **variant), dict(variant)))
    return rows


def measure_row(name, sizes, warmup, iters, out_dir, tag):
    """One row on the device: checked once, then each launch benchmarked."""
    from nki_kernels.backend import nki
    with recording() as launches:
        ok, err = run_case(name, sizes)
    per_launch = []
    for k, launch in enumerate(launches):
        if launch.grid is not None:
            raise RuntimeError(f"{name}: nki.benchmark measures one NeuronCore; an LNC grid "
                               f"launch ({launch.grid}) is validated, not benchmarked")
        base = os.path.join(out_dir, f"{tag}_launch{k}")
        bench = nki.benchmark(warmup=warmup, iters=iters, save_neff_name=base + ".neff",
                              save_trace_name=base + ".ntff")(launch.fn)
        bench(*launch.args, **launch.kwargs)
        lat = bench.benchmark_result.nc_latency
        per_launch.append({f"p{p}_us": float(lat.get_latency_percentile(p)) for p in PERCENTILES}
                          | {"neff": base + ".neff", "ntff": base + ".ntff"})
    row = dict(kernel=name, sizes=sizes, ok=bool(ok), max_err=float(err),
               launches=len(per_launch), per_launch=per_launch)
    for p in PERCENTILES:
        row[f"p{p}_us"] = sum(x[f"p{p}_us"] for x in per_launch)
    return row


def measure(target, out_dir, quick=False, warmup=10, iters=100, log=print):
    """Every bench row measured on the device, with the model's estimate beside it (default
    constants; the simulator's trace of the same sizes); writes ``out_dir/measured.json``."""
    from nki_kernels.backend import BACKEND
    os.makedirs(out_dir, exist_ok=True)
    rows = []
    for i, (name, sizes, variant) in enumerate(bench_rows(quick)):
        t0 = time.perf_counter()
        row = measure_row(name, sizes, warmup, iters, out_dir, f"row{i}_{name}")
        row["variant"] = variant
        rows.append(row)
        log(f"[{name}{''.join(f' {v}' for v in variant.values())}] "
            f"{'OK' if row['ok'] else 'MISMATCH'} p50 {row['p50_us']:.1f} us "
            f"({row['launches']} launch{'es' if row['launches'] != 1 else ''}, "
            f"{time.perf_counter() - t0:.1f} s)")
    data = dict(target=target, backend=BACKEND, warmup=warmup, iters=iters, rows=rows)
    path = os.path.join(out_dir, "measured.json")
    with open(path, "w") as f:
        json.dump(data, f, indent=1)
    return data, path
