"""Fit the cost model's assumed constants to measured latencies (``measure.py``'s
``measured.json``) and write ``calibration.json``.

Each row is re-run in the simulator at its sizes (its instructions, per launch); the model's time
of a row under constants c is the sum over its launches of the scheduled estimate plus c's
launch overhead. The fit minimises the sum over rows of log(model / measured)^2, each constant
within its plausible band (``BANDS``; integers where the model counts): random points of the
bands, Nelder-Mead from the best, then each constant alone (``fit``). Reported per row:
measured, modelled with the default constants and with the fitted ones.
"""

from __future__ import annotations

import json
import math

import numpy as np

# name: (low, high, integer) -- the plausible band of each constant the fit moves
BANDS = {
    "loop_iteration_s": (0.5e-6, 30e-6, False),
    "swdge_cycles_per_descriptor": (0.25, 64.0, False),
    "dma_queues_in_flight": (2, 64, True),
    "dma_descriptor_bytes": (16, 4096, True),
    "launch_overhead_s": (0.0, 100e-6, False),
}


def row_traces(rows, target):
    """Per row, its launches' traces: the row's sizes run in the simulator."""
    from nki_kernels import simulate
    from nki_kernels.registry import KERNELS
    out = []
    for row in rows:
        spec = KERNELS[row["kernel"]]
        inputs = spec.make(row["sizes"], np.random.default_rng(0))
        with simulate.use_target(target), simulate.tracing() as traces:
            spec.run(inputs)
        out.append(list(traces))
    return out


def model_seconds(traces, target, constants):
    """A row's modelled time under ``constants`` (the launch overhead counted per launch)."""
    from nki_kernels.profile import estimate
    return sum(estimate(t, target=target, **constants).seconds for t in traces)


def _loss(all_traces, measured, target, constants):
    return sum(math.log(model_seconds(tr, target, constants) / m) ** 2
               for tr, m in zip(all_traces, measured))


def _search(f, low, high, integer):
    """The argmin of f over [low, high]: a log-spaced scan (linear from 0 for a band starting
    at 0), refined by golden section around the best point."""
    if low == 0:
        grid = np.concatenate([[0.0], np.geomspace(high * 1e-3, high, 23)])
    else:
        grid = np.geomspace(low, high, 24)
    if integer:
        grid = np.unique(np.round(grid).astype(int))
    values = [f(int(x) if integer else float(x)) for x in grid]
    k = int(np.argmin(values))
    best, best_v = grid[k], values[k]
    lo, hi = grid[max(0, k - 1)], grid[min(len(grid) - 1, k + 1)]
    if integer:
        for x in range(int(lo), int(hi) + 1):
            v = f(x)
            if v < best_v:
                best, best_v = x, v
        return int(best), best_v
    phi = (math.sqrt(5) - 1) / 2
    a, b = float(lo), float(hi)
    for _ in range(20):
        c, d = b - phi * (b - a), a + phi * (b - a)
        if f(c) < f(d):
            b = d
        else:
            a = c
    x = (a + b) / 2
    v = f(x)
    return (x, v) if v < best_v else (float(best), best_v)


def _to_unit(name, value):
    """A constant's place in its band, in [0, 1] (log-spaced; linear for a band from 0)."""
    low, high, _ = BANDS[name]
    if low == 0:
        return value / high
    return math.log(value / low) / math.log(high / low)


def _from_unit(name, u):
    low, high, integer = BANDS[name]
    u = min(1.0, max(0.0, u))
    value = u * high if low == 0 else low * (high / low) ** u
    return int(round(value)) if integer else float(value)


def _nelder_mead(f, x0, step=0.08, iterations=120):
    """Minimise f over the unit cube from x0 (plain Nelder-Mead; f clamps its arguments)."""
    n = len(x0)
    simplex = [np.array(x0, float)] + [np.array(x0, float) + step * np.eye(n)[i]
                                       for i in range(n)]
    values = [f(x) for x in simplex]
    for _ in range(iterations):
        order = np.argsort(values)
        simplex, values = [simplex[i] for i in order], [values[i] for i in order]
        centre = np.mean(simplex[:-1], axis=0)
        worst = simplex[-1]
        reflected = centre + (centre - worst)
        fr = f(reflected)
        if fr < values[0]:
            expanded = centre + 2 * (centre - worst)
            fe = f(expanded)
            simplex[-1], values[-1] = (expanded, fe) if fe < fr else (reflected, fr)
        elif fr < values[-2]:
            simplex[-1], values[-1] = reflected, fr
        else:
            contracted = centre + 0.5 * (worst - centre)
            fc = f(contracted)
            if fc < values[-1]:
                simplex[-1], values[-1] = contracted, fc
            else:
                for i in range(1, n + 1):
                    simplex[i] = simplex[0] + 0.5 * (simplex[i] - simplex[0])
                    values[i] = f(simplex[i])
        if max(values) - min(values) < 1e-12:
            break
    k = int(np.argmin(values))
    return simplex[k], values[k]


def fit(measured: dict, names=None, samples=64, starts=3, seed=0, log=print):
    """Fitted constants for ``measured`` (``measure.measure``'s data); returns the calibration
    dict (constants, per-row table, loss before and after). The search: ``samples`` random
    points of the bands' cube and the defaults, Nelder-Mead from the ``starts`` best, then one
    sweep of each constant alone over its band."""
    from nki_kernels.profile.constants import hardware
    target = measured["target"]
    rows = [r for r in measured["rows"] if r["ok"] and r["p50_us"] > 0]
    if not rows:
        raise ValueError("no measured row passed its check: nothing to fit")
    names = list(names or BANDS)
    traces = row_traces(rows, target)
    seconds = [r["p50_us"] * 1e-6 for r in rows]
    hw = hardware(target)
    defaults = {n: getattr(hw, n) for n in names}

    def constants_of(u):
        return {n: _from_unit(n, x) for n, x in zip(names, u)}

    def loss_of(u):
        return _loss(traces, seconds, target, constants_of(np.clip(u, 0, 1)))

    loss0 = _loss(traces, seconds, target, defaults)
    rng = np.random.default_rng(seed)
    points = [np.array([_to_unit(n, defaults[n]) for n in names])]
    points += list(rng.random((samples, len(names))))
    scored = sorted(((loss_of(u), k) for k, u in enumerate(points)))
    log(f"fit: {len(rows)} rows, loss {loss0:.3g} at the defaults, {scored[0][0]:.3g} at the "
        f"best of {len(points)} samples")
    best_u, best = points[scored[0][1]], scored[0][0]
    for _, k in scored[:starts]:
        u, value = _nelder_mead(loss_of, points[k])
        if value < best:
            best_u, best = np.clip(u, 0, 1), value
    constants = constants_of(best_u)
    for name in names:                          # polish: each constant alone over its band
        low, high, integer = BANDS[name]
        value, new = _search(lambda x: _loss(traces, seconds, target, {**constants, name: x}),
                             low, high, integer)
        if new < best:
            constants[name], best = value, new
    log("fit: loss " + f"{best:.3g}: " + ", ".join(f"{n}={constants[n]:.4g}" for n in names))
    table = []
    for row, tr, s in zip(rows, traces, seconds):
        table.append(dict(kernel=row["kernel"], sizes=row["sizes"], measured_us=s * 1e6,
                          default_us=model_seconds(tr, target, defaults) * 1e6,
                          fitted_us=model_seconds(tr, target, constants) * 1e6))
    return dict(target=target, constants=constants, defaults=defaults, loss_default=loss0,
                loss_fitted=best, rows=table)


def markdown(calibration) -> str:
    lines = ["| kernel | sizes | measured us | model (default) us | model (fitted) us | "
             "fitted / measured |", "|" + "---|" * 6]
    for r in calibration["rows"]:
        sizes = ", ".join(f"{k}={v}" for k, v in r["sizes"].items())
        lines.append(f"| {r['kernel']} | {sizes} | {r['measured_us']:.1f} | {r['default_us']:.1f} "
                     f"| {r['fitted_us']:.1f} | {r['fitted_us'] / r['measured_us']:.3f} |")
    lines.append("")
    lines.append("| constant | default | fitted |")
    lines.append("|---|---|---|")
    for name, value in calibration["constants"].items():
        lines.append(f"| {name} | {calibration['defaults'][name]:.4g} | {value:.4g} |")
    return "\n".join(lines)


def load_calibration(path) -> dict:
    """The fitted constants of a ``calibration.json`` (for ``--calibration FILE``)."""
    with open(path) as f:
        data = json.load(f)
    constants = data.get("constants")
    if not isinstance(constants, dict):
        raise ValueError(f"{path}: no 'constants' object (write it with calibrate --fit)")
    return constants
