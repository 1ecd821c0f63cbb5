"""Plans reused across the calls of one serving step.

A serving engine calls ``batch_decode`` / ``batch_prefill`` once per layer with the same step
metadata (query and page tables, lengths, options); only q, the layer's cache and its new K/V
differ, and their contents never enter the plan. So a step's plan (``plan.prepare_decode``,
``plan.prefill_parts``: checks, work items, the sharing between cores, tails, rounds, the
kernel's tables) is made at the first layer's call and handed back at the next ones: their
inputs are the ones that passed the checks then, but for contents no check reads.

What keys a plan: every argument of the planning digested (arrays by shape, dtype and bytes,
dataclasses and tuples field by field), the cache and q by their type, shape, dtype and strides,
the target's NeuronCore version, the bucket and tail-size settings, and the planning modules'
constants and functions (one changed at run time, as tests and probes do, is a new plan,
never a stale one). An argument of any other kind (a device tensor among the per-layer
values) is planned afresh. A kept plan owns its arrays, read-only.
"""

from __future__ import annotations

import dataclasses
import hashlib
import operator
import os
import sys
import threading
from collections import OrderedDict

import numpy as np

# Plans kept: a step's launches (a mixed step plans two), a few steps' worth
PLAN_CACHE_SIZE = 8
# Modules whose UPPER_CASE constants may steer the planning: every loaded one under these
PLANNING_PACKAGES = ("nki_kernels.buckets", "nki_kernels.launch_options",
                     "nki_kernels.paged_attention", "nki_kernels.paged_cache",
                     "nki_kernels.paged_kv_append", "nki_kernels.access_patterns")

_plans: "OrderedDict[tuple, object]" = OrderedDict()
_stats = {"hits": 0, "misses": 0}
_lock = threading.Lock()


class _Uncacheable(Exception):
    """An argument the key cannot digest: plan afresh."""


def reused(make, args, shaped=()):
    """``make(*args)``, or the plan an identical earlier call made; the arguments at the indices
    ``shaped`` (the paged cache, q) are keyed by their type, shape, dtype and layout only: the
    planning reads nothing else of them."""
    try:
        key = plan_key(make, args, shaped)
    except _Uncacheable:
        return make(*args)
    with _lock:
        plan = _plans.get(key)
        if plan is not None:
            _plans.move_to_end(key)
            _stats["hits"] += 1
            return plan
        _stats["misses"] += 1
    plan = _owned(make(*args))
    with _lock:
        _plans[key] = plan
        while len(_plans) > PLAN_CACHE_SIZE:
            _plans.popitem(last=False)
    return plan


def clear():
    """Forget every kept plan (and the counts ``stats`` reports)."""
    with _lock:
        _plans.clear()
        _stats.update(hits=0, misses=0)


def stats() -> dict:
    """{"hits": plans handed back, "misses": plans made, "kept": plans kept now}."""
    return dict(_stats, kept=len(_plans))


def plan_key(make, args, shaped=()) -> tuple:
    """The digest that keys ``make``'s plan of ``args`` (raises ``_Uncacheable``)."""
    from nki_kernels.buckets import PLANNING_SETTINGS
    from nki_kernels.launch_options import host_nc_version
    h = hashlib.blake2b(digest_size=20)
    h.update(f"{make.__module__}.{make.__qualname__};".encode())
    for i, a in enumerate(args):
        if i in shaped:
            _shape_of(h, a)
        else:
            _digest(h, a)
    settings = tuple(os.environ.get(e, "") for e in PLANNING_SETTINGS)
    _digest(h, (host_nc_version(), settings))
    try:
        values = tuple(read(namespace) for namespace, read in _planning_constants())
    except KeyError:                           # a constant removed since: look again
        _constants[0] = -1
        values = tuple(read(namespace) for namespace, read in _planning_constants())
    try:
        hash(values)
    except TypeError:                          # an unhashable value inside a tuple constant
        values = repr(values)
    return h.digest(), values                  # the constants compared whole on a match


_CONSTANT_TYPES = (bool, int, float, str, tuple)
_constants = [-1, ()]        # (how many modules were loaded, (module, constant names) of them)


def _planning_constants() -> tuple:
    """(module namespace, a reader of its UPPER_CASE constants and callables) of the loaded
    modules under PLANNING_PACKAGES (found again when more modules load; the values are read
    at every key: a function replaced at run time, as a test's spy, is a new plan too)."""
    if _constants[0] != len(sys.modules):
        names = sorted(name for name in list(sys.modules)
                       if name.startswith(PLANNING_PACKAGES))
        found = []
        for name in names:
            namespace = vars(sys.modules[name])
            keys = [key for key, value in namespace.items()
                    if (key.isupper() and type(value) in _CONSTANT_TYPES)
                    or (callable(value) and not isinstance(value, type)
                        and not key.startswith("__"))]
            if keys:
                found.append((namespace, operator.itemgetter(*keys, keys[0])))
        _constants[:] = [len(sys.modules), tuple(found)]
    return _constants[1]


def _shape_of(h, x):
    """An array (or a (K, V) pair of them) as the planning sees it: type, shape, dtype, strides."""
    parts = x if isinstance(x, (tuple, list)) else (x,)
    h.update(f"shaped {type(x).__name__} {len(parts)}".encode())
    for part in parts:
        if not hasattr(part, "shape") or not hasattr(part, "dtype"):
            raise _Uncacheable()
        strides = part.strides if isinstance(part, np.ndarray) else None
        h.update(f"{type(part).__name__} {tuple(part.shape)} {part.dtype} {strides}".encode())


def _digest(h, x):
    if x is None:
        h.update(b"N;")
    elif isinstance(x, (bool, int, float, str, np.generic)):
        h.update(f"{type(x).__name__}:{x!r};".encode())
    elif isinstance(x, np.ndarray):
        h.update(f"a{x.shape}{x.dtype};".encode())
        h.update(np.ascontiguousarray(x).tobytes())
    elif isinstance(x, (tuple, list)):
        h.update(f"{type(x).__name__}({len(x)}".encode())
        for item in x:
            _digest(h, item)
        h.update(b")")
    elif dataclasses.is_dataclass(x) and not isinstance(x, type):
        h.update(f"{type(x).__name__}{{".encode())
        for field in dataclasses.fields(x):
            h.update(field.name.encode())
            _digest(h, getattr(x, field.name))
        h.update(b"}")
    else:
        raise _Uncacheable()


def _owned(x):
    """``x`` with every array copied and made read-only, all the way down: a kept plan shares no
    memory with a caller's arrays (a caller may change its sinks or tables in place later) and
    cannot be changed by a later call."""
    if isinstance(x, np.ndarray):
        x = x.copy()
        x.setflags(write=False)
        return x
    if isinstance(x, list):
        return [_owned(item) for item in x]
    if isinstance(x, tuple):
        items = [_owned(item) for item in x]
        return type(x)(*items) if hasattr(x, "_fields") else tuple(items)
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return dataclasses.replace(x, **{f.name: _owned(getattr(x, f.name))
                                         for f in dataclasses.fields(x) if f.init})
    return x
