"""The documented NKI surface and how much of it the simulator implements.

``simulate/manifest.json`` lists every name of the NKI reference stubs (``nki``, ``nki.language``,
``nki.isa``, ``nki.collectives``): module, name, kind, documented parameters, doc source and status.
``tools/nki_manifest.py`` regenerates it from a checkout of the SDK docs; ``check()`` compares it
with the modules ``simulate.install()`` provides. Status:

- ``implemented``: the name exists and a callable takes the documented parameters, in order
  (extra trailing parameters of ours are allowed);
- ``partial``: the name exists but its parameters differ, or it is listed in ``PARTIAL`` (runs
  some documented cases, refuses the rest with ``UnsupportedError``);
- ``not yet``: the name is missing.
"""

from __future__ import annotations

import inspect
import json
import os

MANIFEST = os.path.join(os.path.dirname(os.path.abspath(__file__)), "manifest.json")

# Present, but only some documented behaviour is simulated (the rest raises UnsupportedError).
PARTIAL = set()


def load() -> list:
    with open(MANIFEST) as f:
        return json.load(f)["names"]


def _parameters(obj):
    try:
        params = inspect.signature(obj).parameters.values()
    except (TypeError, ValueError):
        return None
    return [(p.name, p.default is not inspect.Parameter.empty) for p in params
            if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]


def status_of(entry: dict, modules: dict) -> tuple:
    """(status, reason) of one manifest entry against the simulator's modules."""
    module = modules.get(entry["module"])
    if module is None or not hasattr(module, entry["name"]):
        return "not yet", "missing"
    if (entry["module"], entry["name"]) in PARTIAL:
        return "partial", "some documented cases raise UnsupportedError"
    documented = entry.get("parameters")
    if entry["kind"] != "function" or documented is None:
        return "implemented", ""
    ours = _parameters(getattr(module, entry["name"]))
    if ours is None:
        return "implemented", ""
    want = [(p["name"], p["default"] is not None) for p in documented]
    if ours[:len(want)] != want or any(not has_default for _, has_default in ours[len(want):]):
        return "partial", f"parameters {ours} differ from the documented {want}"
    return "implemented", ""


def check(entries=None) -> dict:
    """Status counts and the entries whose recorded status differs from what the modules show."""
    from .nki_module import build_modules
    modules = build_modules()
    entries = load() if entries is None else entries
    counts, stale = {}, []
    for entry in entries:
        status, reason = status_of(entry, modules)
        counts[status] = counts.get(status, 0) + 1
        if status != entry["status"]:
            stale.append((entry["module"], entry["name"], entry["status"], status, reason))
    return {"counts": counts, "total": len(entries), "stale": stale}
