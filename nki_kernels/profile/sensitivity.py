"""How the scheduled estimate moves with the constants no source pins down: each halved and
doubled (``sensitivity``), and all at once over their plausible ranges (``band``: the low and
high printed beside every headline ratio). The trace is re-scheduled, not re-simulated.
"""

from __future__ import annotations

from typing import Dict, Tuple

from .constants import BANDS, hardware
from .cost_model import estimate

UNCERTAIN = tuple(BANDS)


def band(traces, target: str, floor_seconds: float, overrides=None) -> Tuple[float, float]:
    """(low, high) of scheduled/floor over the uncertain constants: the estimate with every one
    at its fastest value, with every one at its slowest (``constants.BANDS``), and as given
    (a list schedule is not monotone in its costs, so the point can sit past a corner).
    ``overrides``: other constants held (e.g. a calibration's), which also pin any uncertain
    one they name."""
    traces = traces if isinstance(traces, (list, tuple)) else [traces]
    held = dict(overrides or {})
    corners = [sum(estimate(t, target=target, **held).seconds for t in traces) / floor_seconds]
    for k in (0, 1):
        change = {name: ends[k] for name, ends in BANDS.items() if name not in held}
        corners.append(sum(estimate(t, target=target, **held, **change).seconds
                           for t in traces) / floor_seconds)
    return min(corners), max(corners)


def sensitivity(traces, target: str, floor_seconds: float) -> Dict[str, Tuple[float, float]]:
    """{constant: (scheduled/floor with it halved, with it doubled)}; "base" holds the
    unchanged ratio twice. ``traces``: one trace, or the launches of one step (run one after
    the other, so their times add up, as in the benchmark table)."""
    traces = traces if isinstance(traces, (list, tuple)) else [traces]

    def ratio(**change):
        return sum(estimate(t, target=target, **change).seconds for t in traces) / floor_seconds

    base = ratio()
    out = {"base": (base, base)}
    for name in UNCERTAIN:
        value = getattr(hardware(target), name)
        half = max(1, value // 2) if isinstance(value, int) else value / 2
        out[name] = (ratio(**{name: half}), ratio(**{name: value * 2}))
    return out


def markdown(rows) -> str:
    """rows: [(kernel, target, {constant: (half, double)})]."""
    head = "| kernel | target | scheduled/floor | " + " | ".join(
        f"{c} x0.5 / x2" for c in UNCERTAIN) + " |"
    lines = [head, "|" + "---|" * (3 + len(UNCERTAIN))]
    for kernel, target, s in rows:
        lines.append(f"| {kernel} | {target} | {s['base'][0]:.2f} | " + " | ".join(
            f"{s[c][0]:.2f} / {s[c][1]:.2f}" for c in UNCERTAIN) + " |")
    return "\n".join(lines)
