"""``nki-kernels``: check, profile and benchmark the kernels (simulator on a CPU, real NKI on trn).

    nki-kernels list
    nki-kernels check paged_decode_attention --size batch=4 --size kv_len=300 [--target trn1]
    nki-kernels profile tensor_scatter --trace-json ts.json --png ts.png [--set hbm_bytes_per_s=3e11]
    nki-kernels bench [--out benchmarks/results]
    nki-kernels serve --steps 64 --max-batch 8 [--target trn1] [--png serve.png] [--out DIR]
    nki-kernels demo                     # the README's main job: every kernel checked and costed

On a Trainium instance (docs/hardware.md; NKI_KERNELS_REHEARSE=1 rehearses it on a CPU):
    nki-kernels validate --device trn [--quick]
    nki-kernels bench --device trn --out DIR [--quick]      # DIR/measured.json, NEFF/NTFF files
    nki-kernels calibrate --fit DIR/measured.json           # DIR/calibration.json
    nki-kernels bench|profile|serve ... --calibration DIR/calibration.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

from .registry import KERNELS, compare


def _sizes(spec, pairs, default):
    sizes = dict(default)
    for pair in pairs or []:
        key, _, value = pair.partition("=")
        if key not in sizes and key not in ("dtype", "mode", "layout"):
            raise SystemExit(f"--size {key}: {spec.name} takes {sorted(sizes)}")
        sizes[key] = value
    return sizes


def _on_hardware() -> bool:
    from .backend import ON_HARDWARE
    return ON_HARDWARE


def _device_check(device):
    if device == "trn":
        from .backend import require_hardware
        try:
            require_hardware("--device trn")
        except RuntimeError as err:
            raise SystemExit(f"error: {err}") from None


def _calibrated(args):
    """The cost-model overrides of ``--calibration FILE`` (and ``--set``), or {}."""
    overrides = {}
    if getattr(args, "calibration", None):
        from .device.fit import load_calibration
        try:
            overrides.update(load_calibration(args.calibration))
        except (OSError, ValueError) as err:
            raise SystemExit(f"error: --calibration: {err}") from None
    return overrides


def _device_target(args):
    """The instance generation of a device command, refused in one line when the installed SDK
    cannot run the kernels on it (``device/sdk.py``)."""
    from .backend import BACKEND, nki
    from .device.sdk import rehearsal_note, sdk_problem
    target = args.target
    if BACKEND == "rehearsal":
        from .device.rehearse import rehearsal_target
        target = rehearsal_target()
    problem = sdk_problem(BACKEND, nki, target)
    if problem:
        raise SystemExit(f"error: {problem}")
    note = rehearsal_note(BACKEND, target)
    if note:
        print(note)
    return target


def cmd_validate(args):
    from .device.validate import validate
    ok, table = validate(_device_target(args), quick=args.quick)
    print("\n" + table)
    print("\nall kernels pass on the device" if ok else "\nSOME KERNELS FAIL ON THE DEVICE")
    return 0 if ok else 1


def cmd_device_bench(args):
    from .device.measure import measure
    data, path = measure(_device_target(args), args.out, quick=args.quick, warmup=args.warmup,
                         iters=args.iters)
    lines = ["| kernel | sizes | launches | p50 us | p90 us | p99 us | ok |", "|" + "---|" * 7]
    for r in data["rows"]:
        sizes = ", ".join(f"{k}={v}" for k, v in r["sizes"].items())
        lines.append(f"| {r['kernel']} | {sizes} | {r['launches']} | {r['p50_us']:.1f} "
                     f"| {r['p90_us']:.1f} | {r['p99_us']:.1f} | {'yes' if r['ok'] else 'NO'} |")
    print("\n" + "\n".join(lines))
    print(f"\nwrote {path} (modelled beside measured: nki-kernels calibrate --fit {path})")
    return 0 if all(r["ok"] for r in data["rows"]) else 1


def cmd_fit(args):
    from .backend import BACKEND
    if BACKEND == "nki":       # the fit re-runs the rows in the simulator: a process of its own
        import subprocess
        env = dict(os.environ, NKI_KERNELS_BACKEND="sim", NKI_KERNELS_REHEARSE="0")
        return subprocess.call([sys.executable, "-m", "nki_kernels", "calibrate", "--fit",
                                args.fit] + (["--out", args.out] if args.out else []), env=env)
    from .device.fit import fit, markdown
    with open(args.fit) as f:
        measured = json.load(f)
    calibration = fit(measured)
    table = markdown(calibration)
    print("\n" + table)
    out = args.out or os.path.dirname(os.path.abspath(args.fit))
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, "calibration.json")
    with open(path, "w") as f:
        json.dump(calibration, f, indent=1, default=float)
    with open(os.path.join(out, "calibration.md"), "w") as f:
        f.write(table + "\n")
    print(f"\nloss {calibration['loss_default']:.3g} with the default constants, "
          f"{calibration['loss_fitted']:.3g} fitted; wrote {path}")
    return 0


def _simulate(spec, inputs, target):
    from .backend import ON_HARDWARE
    if ON_HARDWARE:                        # real nki: the kernel runs on the NeuronCore, no trace
        t0 = time.perf_counter()
        out = spec.run(inputs)
        return out, time.perf_counter() - t0, None
    from nki_kernels import simulate
    with simulate.use_target(target), simulate.tracing() as traces:
        t0 = time.perf_counter()
        out = spec.run(inputs)
        elapsed = time.perf_counter() - t0
    return out, elapsed, traces


def _timed_reference(spec, inputs, budget_s=3.0):
    """(reference output, its fastest time of up to three runs within ``budget_s``): one run's
    time varies up to 2x with memory state, which made the simulator/reference ratio swing."""
    best, out, spent = float("inf"), None, 0.0
    for _ in range(3):
        t0 = time.perf_counter()
        out = spec.ref(inputs)
        took = time.perf_counter() - t0
        best, spent = min(best, took), spent + took
        if spent > budget_s:
            break
    return out, best


def check(name, sizes, target, log=print):
    """Run one kernel in the simulator against its reference; returns a result row."""
    spec = KERNELS[name]
    inputs = spec.make(sizes, np.random.default_rng(0))
    where = "on the NeuronCore" if _on_hardware() else "in the simulator"
    log(f"[{name}] {target}: running the kernel {where} ...")
    out, sim_s, traces = _simulate(spec, inputs, target)
    trace = traces[-1] if traces else None
    ref, ref_s = _timed_reference(spec, inputs)
    ok, err = compare(spec, inputs, out, ref)
    count = (f"{sum(len(t) for t in traces)} instructions in {len(traces)} launch"
             f"{'es' if len(traces) > 1 else ''}, simulator" if trace is not None else "device")
    log(f"[{name}] {'OK' if ok else 'MISMATCH'} vs NumPy reference (max abs error {err:.3g}); "
        f"{count} {sim_s:.2f} s, reference {ref_s:.3f} s")
    return dict(kernel=name, target=target, ok=ok, max_err=err, sim_s=sim_s, ref_s=ref_s,
                trace=trace, traces=traces, inputs=inputs, spec=spec)


def cost_row(row, overrides=None):
    """The table row of a checked run: its launches run one after the other, so times, bytes and
    instructions add up (``est``, returned for the timeline, is the last launch's)."""
    from .profile import estimate
    ests = [estimate(t, target=row["target"], **(overrides or {})) for t in row["traces"]]
    est = ests[-1]
    spec, inputs = row["spec"], row["inputs"]
    total = lambda f: sum(f(e) for e in ests)      # noqa: E731
    min_bytes = spec.min_bytes(inputs)
    # the floor of the cores the launch used (two under LNC=2): bytes, FLOPs, elementwise passes
    from .registry import step_floor
    floor = step_floor(spec, inputs, est.hw, est.cores).seconds
    seconds, lower = total(lambda e: e.seconds), total(lambda e: e.lower_seconds)
    from .profile.sensitivity import band
    low, high = band(row["traces"], row["target"], floor, overrides) if floor else (0.0, 0.0)
    return dict(band_low=low, band_high=high, kernel=row["kernel"], target=row["target"], ok=row["ok"],
                instructions=total(lambda e: sum(e.instructions.values())),
                dma=total(lambda e: e.dma_count), hbm_bytes=total(lambda e: e.hbm_bytes),
                min_bytes=min_bytes, bytes_ratio=total(lambda e: e.hbm_bytes) / max(1, min_bytes),
                est_us=seconds * 1e6, lower_us=lower * 1e6,
                serial_us=total(lambda e: e.serial_seconds) * 1e6, floor_us=floor * 1e6,
                vs_floor=seconds / floor if floor else float("nan"),
                lower_vs_floor=lower / floor if floor else float("nan"),
                sim_vs_ref=row["sim_s"] / max(row["ref_s"], 1e-9)), est


def markdown(rows):
    head = ("| kernel | target | ok | instr | DMAs | HBM bytes | min bytes | bytes/min "
            "| scheduled us | lower us | serial us | floor us | scheduled/floor (band) "
            "| lower/floor | sim/ref time |")
    lines = [head, "|" + "---|" * 15]
    for r in rows:
        lines.append(f"| {r['kernel']} | {r['target']} | {'yes' if r['ok'] else 'NO'} | {r['instructions']} "
                     f"| {r['dma']} | {r['hbm_bytes']} | {r['min_bytes']} | {r['bytes_ratio']:.2f} "
                     f"| {r['est_us']:.1f} | {r['lower_us']:.1f} | {r['serial_us']:.1f} "
                     f"| {r['floor_us']:.1f} | {r['vs_floor']:.2f} ({r['band_low']:.2f}-"
                     f"{r['band_high']:.2f}) | {r['lower_vs_floor']:.1f} "
                     f"| {r['sim_vs_ref']:.1f} |")
    return "\n".join(lines)


def explain(est) -> str:
    """What the schedule says: engine work and utilisation, loop barriers, the critical path."""
    util = est.schedule.utilisation()
    lines = ["per resource: " + ", ".join(
        f"{k} {v * 1e6:.1f} us work ({est.instructions.get(k, 0)} instr"
        + (f", {100 * max(u for (c, lane), u in util.items() if lane == k):.0f}% busy"
           if any(lane == k for _, lane in util) else "") + ")"
        for k, v in sorted(est.engine_seconds.items()))]
    if est.schedule.barriers:
        lines.append(f"loop-iteration barriers: {max(est.schedule.barriers.values())} x "
                     f"{est.hw.loop_iteration_s * 1e6:.1f} us = {est.barrier_seconds * 1e6:.1f} us")
    crit = est.schedule.critical_summary()
    lines.append(f"critical path ({len(est.schedule.critical)} instructions): " + ", ".join(
        f"{k} {v * 1e6:.1f} us" for k, v in sorted(crit.items(), key=lambda kv: -kv[1])))
    return "\n".join(lines)


def _parse_overrides(pairs):
    return {k: float(v) if "." in v or "e" in v.lower() else int(v)
            for k, _, v in (p.partition("=") for p in pairs or [])}


def cmd_profile_file(args):
    """``profile path/to/file.py:kernel --arg name=SPEC``: any kernel, costed (profile.foreign)."""
    from .profile.foreign import cost_kernel, load_kernel, parse_arg, report
    kwargs = {}
    for item in args.arg or []:
        name, eq, spec = item.partition("=")
        if not eq or not name:
            raise SystemExit(f"error: --arg {item!r} must be name=SPEC (see `profile --help`)")
        kwargs[name] = parse_arg(spec)
    kernel = load_kernel(args.kernel)
    _, estimates = cost_kernel(kernel, target=args.target, lnc=args.lnc,
                               overrides={**_calibrated(args), **_parse_overrides(args.set)},
                               **kwargs)
    argument_bytes = sum(a.nbytes for a in kwargs.values() if isinstance(a, np.ndarray))
    print(report(args.kernel.rpartition(":")[2], estimates, argument_bytes))
    for est in estimates:
        print("\n" + explain(est))
    from .profile import chrome_trace, png_timeline
    if estimates and args.trace_json:
        chrome_trace(estimates[-1], args.trace_json, args.kernel)
        print(f"wrote {args.trace_json}")
    if estimates and args.png:
        png_timeline(estimates[-1], args.png, f"{args.kernel} on {args.target} (modelled)")
        print(f"wrote {args.png}")
    return 0


def cmd_profile(args):
    if args.kernel not in KERNELS:
        if ":" in args.kernel:
            return cmd_profile_file(args)
        raise SystemExit(f"error: kernel {args.kernel!r} is none of {sorted(KERNELS)} and not "
                         f"path/to/file.py:kernel")
    spec = KERNELS[args.kernel]
    row = check(args.kernel, _sizes(spec, args.size, spec.demo), args.target)
    if row["trace"] is None:
        print("on a NeuronCore: profile with neuron-explorer (NEURON_FRAMEWORK_DEBUG=1 saves the NEFF)")
        return 0 if row["ok"] else 1
    table, est = cost_row(row, {**_calibrated(args), **_parse_overrides(args.set)})
    print(markdown([table]))
    print("\n" + explain(est))
    from .profile import chrome_trace, png_timeline
    if args.trace_json:
        chrome_trace(est, args.trace_json, args.kernel)
        print(f"wrote {args.trace_json} (open in ui.perfetto.dev or chrome://tracing)")
    if args.png:
        png_timeline(est, args.png, f"{args.kernel} on {args.target} (modelled)")
        print(f"wrote {args.png}")
    return 0 if row["ok"] else 1


def cmd_calibrate(args=None):
    if args is not None and args.fit:
        return cmd_fit(args)
    from .profile.calibration.published import markdown as calibration_markdown, run_all
    results = run_all()
    print(calibration_markdown(results))
    missed = [f.name for f, _, _, ok in results if not ok]
    print(f"\n{len(results) - len(missed)} of {len(results)} published figures reproduced"
          + (f"; not: {', '.join(missed)}" if missed else ""))
    return 0 if all(ok == f.reproduced for f, _, _, ok in results) else 1


def cmd_suite(args, which):
    rows, moved, ok = [], [], True
    for name, spec in KERNELS.items():
        for target in args.targets:
            for variant in (spec.variants if which == "bench" else ({},)):
                row = check(name, dict(getattr(spec, which), **variant), target)
                ok &= row["ok"]
                if row["trace"] is not None:
                    label = name + "".join(f" {v}" for v in variant.values())
                    table_row = dict(cost_row(row, _calibrated(args))[0], kernel=label)
                    rows.append(table_row)
                    if which == "bench":
                        from .profile.sensitivity import sensitivity
                        moved.append((label, target, sensitivity(
                            row["traces"], target, table_row["floor_us"] * 1e-6)))
    table = markdown(rows)
    print("\n" + table)
    if which == "bench":
        from .profile.sensitivity import markdown as sensitivity_markdown
        moves = sensitivity_markdown(moved)
        print("\nscheduled/floor with each uncertain constant halved / doubled:\n" + moves)
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "bench.md"), "w") as f:
            f.write(table + "\n")
        with open(os.path.join(args.out, "sensitivity.md"), "w") as f:
            f.write(moves + "\n")
        with open(os.path.join(args.out, "bench.json"), "w") as f:
            json.dump(rows, f, indent=1, default=float)
        print(f"\nwrote {args.out}/bench.md and bench.json")
    print("\nall kernels match their references" if ok else "\nSOME KERNELS DO NOT MATCH")
    return 0 if ok else 1


def cmd_serve(args):
    from .serve import PRESETS, plot_steps, replay, summary_markdown
    if _on_hardware():
        raise SystemExit("error: serve replays the trace in the simulator (it needs the trace to "
                         "count compiles and cost steps); run it without the Neuron SDK backend")
    import dataclasses
    base = PRESETS[args.preset]
    given = {k: v for k, v in (("steps", args.steps), ("max_batch", args.max_batch),
                               ("pages", args.pages), ("dtype", args.dtype),
                               ("prefill_chunk", args.prefill_chunk)) if v is not None}
    cfg = dataclasses.replace(base, lnc=args.lnc, **given)
    if cfg.lnc == 2 and args.target == "trn1":
        raise SystemExit("error: --lnc 2 needs --target trn2 (trn1 has one core per logical core)")
    trace = replay(cfg, args.target, overrides=_calibrated(args))
    table = summary_markdown(trace)
    print(table)
    if args.png:
        plot_steps(trace, args.png)
        print(f"\nwrote {args.png}")
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        base = os.path.join(args.out, f"serve_{args.preset}_{args.target}_lnc{cfg.lnc}")
        with open(base + ".md", "w") as f:
            f.write(table + "\n")
        with open(base + ".json", "w") as f:
            json.dump({"compilations": trace.compilations,
                       "steps": [vars(x) for x in trace.steps]}, f, indent=1, default=float)
        print(f"wrote {base}.md and .json")
    return 0 if trace.max_error < cfg.tolerance else 1


def main(argv=None):
    p = argparse.ArgumentParser(prog="nki-kernels", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("list", help="the kernels and their default sizes")
    for cmd in ("run", "check", "profile"):
        s = sub.add_parser(cmd, help="run a kernel against its reference" + (" and cost it" if cmd == "profile" else ""))
        if cmd == "profile":
            s.add_argument("kernel", help=f"one of {', '.join(sorted(KERNELS))}, or any kernel "
                                          f"as path/to/file.py:kernel (with --arg)")
            s.add_argument("--arg", action="append",
                           help="a file kernel's argument: name=SHAPE:DTYPE (random; :arange "
                                "numbers it) or name=NUMBER")
            s.add_argument("--lnc", type=int, default=1, choices=(1, 2))
        else:
            s.add_argument("kernel", choices=sorted(KERNELS))
        s.add_argument("--size", action="append", help="key=value (see `list`)")
        s.add_argument("--target", default="trn2", choices=("trn1", "trn2"))
        s.add_argument("--device", default="sim", choices=("sim", "trn"))
        s.add_argument("--set", action="append", help="override a cost-model constant, name=value")
        s.add_argument("--calibration", help="calibration.json of calibrate --fit")
        s.add_argument("--trace-json")
        s.add_argument("--png")
    for cmd in ("demo", "bench"):
        s = sub.add_parser(cmd, help="every kernel at " + ("moderate" if cmd == "demo" else "realistic") + " sizes")
        s.add_argument("--targets", nargs="+", default=["trn1", "trn2"] if cmd == "demo" else ["trn2"])
        s.add_argument("--device", default="sim", choices=("sim", "trn"))
        s.add_argument("--out", default=os.path.join("benchmarks", "results"))
        if cmd == "bench":
            s.add_argument("--quick", action="store_true",
                           help="--device trn: each kernel at its demo sizes")
            s.add_argument("--warmup", type=int, default=10)
            s.add_argument("--iters", type=int, default=100)
            s.add_argument("--target", default="trn2", choices=("trn1", "trn2"),
                           help="--device trn: the instance's generation")
            s.add_argument("--calibration", help="calibration.json of calibrate --fit")
    s = sub.add_parser("validate", help="every kernel on the device against its reference")
    s.add_argument("--device", default="trn", choices=("trn",))
    s.add_argument("--target", default="trn2", choices=("trn1", "trn2"))
    s.add_argument("--quick", action="store_true", help="small sizes only")
    s = sub.add_parser("calibrate", help="the cost model against figures AWS publishes, or "
                                         "(--fit) its assumed constants fitted to measurements")
    s.add_argument("--fit", help="measured.json of bench --device trn")
    s.add_argument("--out", help="where calibration.json goes (default: beside --fit)")
    s = sub.add_parser("serve", help="replay a continuous-batching trace: compiles, time per step")
    s.add_argument("--preset", default="small", choices=("small", "llama8b"),
                   help="model shape and trace (serve.PRESETS); the flags below override it")
    s.add_argument("--steps", type=int)
    s.add_argument("--max-batch", type=int)
    s.add_argument("--pages", type=int)
    s.add_argument("--dtype", choices=("float32", "bfloat16", "float16"))
    s.add_argument("--lnc", type=int, default=1, choices=(1, 2),
                   help="2: append and decode share each step over the two cores (trn2)")
    s.add_argument("--prefill-chunk", type=int,
                   help="> 0: chunked prefill mixed with decode, this many prompt tokens per "
                        "request per step, one fused write+attention launch per step")
    s.add_argument("--target", default="trn2", choices=("trn1", "trn2"))
    s.add_argument("--png", help="write the per-step plot here")
    s.add_argument("--out", help="write serve_<target>.md and .json here")
    s.add_argument("--calibration", help="calibration.json of calibrate --fit")
    args = p.parse_args(argv)
    _device_check(getattr(args, "device", "sim"))
    if args.cmd in ("demo", "bench") and _on_hardware():
        args.targets = args.targets[:1]
    if args.cmd == "list":
        for name, spec in KERNELS.items():
            print(f"{name}: {spec.doc}\n  demo sizes: {spec.demo}\n  bench sizes: {spec.bench}")
        return 0
    if args.cmd in ("run", "check"):
        spec = KERNELS[args.kernel]
        return 0 if check(args.kernel, _sizes(spec, args.size, spec.demo), args.target)["ok"] else 1
    if args.cmd == "profile":
        return cmd_profile(args)
    if args.cmd == "calibrate":
        return cmd_calibrate(args)
    if args.cmd == "validate":
        return cmd_validate(args)
    if args.cmd == "bench" and args.device == "trn":
        return cmd_device_bench(args)
    if args.cmd == "serve":
        return cmd_serve(args)
    return cmd_suite(args, args.cmd)


if __name__ == "__main__":
    sys.exit(main())
