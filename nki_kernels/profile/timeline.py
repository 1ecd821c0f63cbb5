"""Export a modelled timeline: Chrome/Perfetto trace JSON and a per-engine PNG."""

from __future__ import annotations

import json

ENGINES = ("dma", "tensor", "vector", "scalar", "gpsimd")


def chrome_trace(estimate, path: str, name: str = "kernel") -> dict:
    """Write ``{"traceEvents": [...]}`` (complete events, microseconds) viewable in Perfetto."""
    events = [{"name": "process_name", "ph": "M", "pid": 0, "args": {"name": f"{name} ({estimate.hw.name}, modelled)"}}]
    for tid, engine in enumerate(ENGINES):
        events.append({"name": "thread_name", "ph": "M", "pid": 0, "tid": tid, "args": {"name": engine}})
    for engine, op, start, dur in estimate.timeline:
        events.append({"name": op, "cat": engine, "ph": "X", "pid": 0,
                       "tid": ENGINES.index(engine) if engine in ENGINES else len(ENGINES),
                       "ts": start * 1e6, "dur": dur * 1e6})
    doc = {"traceEvents": events, "displayTimeUnit": "ns"}
    with open(path, "w") as f:
        json.dump(doc, f)
    return doc


def png_timeline(estimate, path: str, title: str = "modelled timeline") -> None:
    """One row per engine, a bar per instruction (matplotlib, imported here only)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(10, 3))
    for row, engine in enumerate(ENGINES):
        bars = [(s * 1e6, d * 1e6) for e, _, s, d in estimate.timeline if e == engine]
        if bars:
            ax.broken_barh(bars, (row - 0.4, 0.8))
    ax.set_yticks(range(len(ENGINES)), ENGINES)
    ax.set_xlabel("time (us, modelled)")
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
