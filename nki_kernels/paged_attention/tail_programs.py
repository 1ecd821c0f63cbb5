"""Whole units' tails sized per unit position, within a budget of programs a bucket.

A chunked-prefill launch's whole units end in tails of static sizes (``work.tail_profile``):
the least size each unit position needs ("exact") leaves no empty slot, but makes about one
program per new length pattern; the default mode ("lead", "off" on one core) keeps a few
programs a bucket and pays for empty slots. With ``NKI_KERNELS_TAIL_PROGRAMS=K`` a launch takes
its exact sizes while its bucket has made fewer than K such programs in this process (or when
the sizes are one it made), else the cheapest of the bucket's earlier ones that holds its units,
else the default's: at most K programs more a bucket, which a serving loop meets early and
reuses after (``choose``). The choice is the host's cost of loop iterations and slots
(``plan_cost``, the constants of ``work.unit_tail_cost``).
"""

from __future__ import annotations

import threading

from nki_kernels.buckets import tail_programs

from .work import (C0, C1, FULL_HI, FULL_LO, LEN, ROUND_CHUNKS, ROUNDS, ROUNDS1,
                   UNIT_TAIL_EMPTY_SLOT, UNIT_TAIL_SLOT, _tail_needs, _unit_loop_cost,
                   body_groups, chunk_tokens, lead_groups, tailed_units)

# Exact profiles made per bucket key in this process, in the order first taken
_made: dict = {}
_lock = threading.Lock()


def forget():
    """Drop the record of the exact profiles made (a new process starts with none)."""
    with _lock:
        _made.clear()


def made(key) -> list:
    """The exact profiles made for ``key`` so far (a copy)."""
    with _lock:
        return list(_made.get(key, ()))


def plan_cost(rows, spans, per, lead, slots, profile, page_size) -> float:
    """The host's cost of tailed rows under ``profile``: each unit's loop iterations before its
    group's rounds, each group's rounds, UNIT_TAIL_EMPTY_SLOT an empty tail slot and
    UNIT_TAIL_SLOT a slot (``work.unit_tail_cost``'s terms), over the kernel's bodies."""
    T = chunk_tokens(page_size)
    cost = 0.0
    for body, start, n in body_groups(spans, per, lead):
        sizes = profile[body] if body < len(profile) else (slots,) * n
        lead_row = rows[start]
        taken = int(lead_row[ROUNDS]) * ROUND_CHUNKS + int(lead_row[ROUNDS1])
        cost += int(lead_row[ROUNDS]) + int(lead_row[ROUNDS1]) if n > 1 else 0
        for k in range(n):
            row = rows[start + k]
            need = max(1, -(-int(row[LEN]) // T) - int(row[C1]))
            cost += _unit_loop_cost(int(row[C0]), int(row[FULL_LO]), int(row[FULL_HI]),
                                    int(row[C1]) - (taken if n > 1 else 0))
            cost += UNIT_TAIL_EMPTY_SLOT * max(0, sizes[k] - need) + UNIT_TAIL_SLOT * sizes[k]
    return cost


def holds(rows, spans, per, lead, profile, page_size) -> bool:
    """Whether every unit position of ``profile`` has the slots its units need."""
    needs = _tail_needs(rows, spans, per, lead, page_size)
    for body, sizes in enumerate(profile):
        for k, need in needs[body].items():
            if k >= len(sizes) or need > sizes[k]:
                return False
    return True


def choose(untailed, spans, per, lead, slots, page_size, batch_rows, cores, mode, sizes, key,
           scope=()):
    """(rows, lead tails, profile) of whole units ``untailed``: the default ``mode``'s, or
    within ``buckets.tail_programs()`` exact profiles for the bucket (``scope + key``: the
    launch's other static arguments, its bucket and tail size) the exact one (or an earlier
    exact one that holds the units) when the host's cost (``plan_cost``) is lower.
    ``sizes``: (the sizes a lead group may take, the launch's menu), as
    ``work.tailed_units``."""
    key = tuple(scope) + tuple(key)
    base = tailed_units(untailed, spans, per, lead, slots, page_size, batch_rows, cores, mode,
                        sizes)
    budget = tail_programs()
    if not budget or mode == "exact":
        return base
    leading = len(lead_groups(lead, per))

    def cost(candidate):
        return plan_cost(candidate[0], spans, per, lead, slots, candidate[2], page_size)
    best, best_cost = base, cost(base)
    exact = tailed_units(untailed, spans, per, lead, slots, page_size, batch_rows, cores,
                         "exact", sizes)
    with _lock:
        known = _made.setdefault(key, [])
        fresh = exact[2] not in known and len(known) < budget
        earlier = list(known)
    if exact[2] in earlier or fresh:
        if cost(exact) < best_cost - 1e-9:
            if fresh:
                with _lock:
                    if exact[2] not in _made[key]:
                        _made[key].append(exact[2])
            return exact
        return best
    for profile in earlier:            # the budget is spent: an exact profile made before
        tails = tuple(max(profile[b]) if b < len(profile) and max(profile[b]) > slots else 0
                      for b in range(leading))
        while tails and not tails[-1]:
            tails = tails[:-1]
        candidate = tailed_units(untailed, spans, per, lead, slots, page_size, batch_rows,
                                 cores, "exact", sizes, lead_tail=tails, profile=profile)
        if holds(candidate[0], spans, per, lead, profile, page_size):
            price = cost(candidate)
            if price < best_cost - 1e-9:
                best, best_cost = candidate, price
    return best
