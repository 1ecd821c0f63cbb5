"""Export the modelled schedule: Chrome/Perfetto trace JSON and a PNG timeline.

Both show the dependency-aware schedule (``schedule.py``): one row per engine (per core when an
LNC=2 launch uses two), a box per instruction at its scheduled start, idle gaps as gaps, and the
critical path marked. The JSON adds flow arrows from each instruction to the one that waited for
its data, and puts the three figures (scheduled, lower bound, serial) in the process name.
"""

from __future__ import annotations

import json

LANES = ("dma", "dge", "tensor", "vector", "scalar", "gpsimd")


def _lanes(estimate):
    """Row order: (core, lane) pairs that occur."""
    used = {(s.core, s.lane) for s in estimate.schedule.slots}
    return [(c, lane) for c in range(estimate.cores) for lane in LANES if (c, lane) in used]


def _label(estimate, core, lane):
    return f"core{core} {lane}" if estimate.cores > 1 else lane


def chrome_trace(estimate, path: str, name: str = "kernel") -> dict:
    """Write ``{"traceEvents": [...]}`` (complete events, microseconds) viewable in Perfetto."""
    plan = estimate.schedule
    rows = _lanes(estimate)
    tid = {row: i for i, row in enumerate(rows)}
    title = (f"{name} ({estimate.hw.name}, modelled: scheduled {estimate.seconds * 1e6:.1f} us, "
             f"lower bound {estimate.lower_seconds * 1e6:.1f}, serial "
             f"{estimate.serial_seconds * 1e6:.1f})")
    events = [{"name": "process_name", "ph": "M", "pid": 0, "args": {"name": title}}]
    for row, i in tid.items():
        events.append({"name": "thread_name", "ph": "M", "pid": 0, "tid": i,
                       "args": {"name": _label(estimate, *row)}})
    critical = set(plan.critical)
    for k, s in enumerate(plan.slots):
        events.append({"name": s.op, "cat": "critical" if k in critical else s.lane, "ph": "X",
                       "pid": 0, "tid": tid[(s.core, s.lane)], "ts": s.start * 1e6,
                       "dur": (s.end - s.start) * 1e6,
                       "args": {"event": s.index, "waited for": s.reason,
                                "critical": k in critical}})
    flow = 0
    for k, s in enumerate(plan.slots):
        if s.waited_for is None or s.reason not in ("data", "descriptors"):
            continue
        src = plan.slots[s.waited_for]
        flow += 1
        events.append({"name": s.reason, "cat": "dependency", "ph": "s", "id": flow, "pid": 0,
                       "tid": tid[(src.core, src.lane)], "ts": src.end * 1e6 - 1e-3})
        events.append({"name": s.reason, "cat": "dependency", "ph": "f", "bp": "e", "id": flow,
                       "pid": 0, "tid": tid[(s.core, s.lane)], "ts": s.start * 1e6})
    doc = {"traceEvents": events, "displayTimeUnit": "ns"}
    with open(path, "w") as f:
        json.dump(doc, f)
    return doc


def _kind(op: str) -> str:
    """Colour class of an instruction label."""
    if "descriptors" in op:
        return "descriptors"
    if op.startswith("dma") or "dma" in op:
        return "dma"
    return op


def png_timeline(estimate, path: str, title: str = "modelled timeline") -> None:
    """Instructions as boxes per engine over time, coloured by kind; the critical path as a red
    strip under its boxes; loop barriers as the gaps where every row is idle (matplotlib, imported here)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    plan = estimate.schedule
    rows = _lanes(estimate)
    bars, total = {}, {}                      # (row, kind) -> boxes; kind -> time (legend order)
    for s in plan.slots:
        kind = _kind(s.op)
        bars.setdefault(((s.core, s.lane), kind), []).append((s.start * 1e6, (s.end - s.start) * 1e6))
        total[kind] = total.get(kind, 0.0) + s.end - s.start
    kinds = sorted(total, key=lambda k: -total[k])
    palette = plt.get_cmap("tab20")
    colour = {k: palette(i % 20) for i, k in enumerate(kinds)}
    fig, ax = plt.subplots(figsize=(12, 1.2 + 0.5 * len(rows)))
    for (row, kind), boxes in bars.items():
        ax.broken_barh(boxes, (rows.index(row) - 0.4, 0.68), facecolors=colour[kind], linewidth=0)
    crit = {}
    for k in plan.critical:
        s = plan.slots[k]
        crit.setdefault((s.core, s.lane), []).append((s.start * 1e6, (s.end - s.start) * 1e6))
    for row, bars in crit.items():            # a red strip under each box on the path
        ax.broken_barh(bars, (rows.index(row) + 0.28, 0.14), facecolors="red", linewidth=0)
    ax.set_yticks(range(len(rows)), [_label(estimate, *r) for r in rows])
    ax.invert_yaxis()
    ax.set_xlim(0, max(plan.makespan * 1e6, 1e-3))
    ax.set_xlabel("time (us, modelled)")
    ax.set_title(f"{title}: scheduled {estimate.seconds * 1e6:.1f} us (lower bound "
                 f"{estimate.lower_seconds * 1e6:.1f}, serial {estimate.serial_seconds * 1e6:.1f})",
                 fontsize=9)
    handles = [Patch(color=colour[k], label=k) for k in kinds[:12]]
    handles.append(Patch(color="red", label="critical path"))
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
