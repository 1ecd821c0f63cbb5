"""``nki.collectives``: replica groups and collective operations across ranks.

A rank is one device program (a NeuronCore or an LNC=2 pair) in a multi-rank job. The simulator
runs the ranks of ``simulate.simulate(kernel, ranks=N)`` concurrently, one thread each, and a
collective completes when every rank of the caller's replica group has reached it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List

from . import context
from .errors import UnsupportedError
from .objects import NKIObject


@dataclass
class ReplicaGroup(NKIObject):
    """Groups of ranks taking part in a collective, e.g. ``ReplicaGroup([[0, 1], [2, 3]])``;
    sub-groups must not overlap."""

    replica_groups: List[List[int]] = field(default_factory=list)

    def __post_init__(self):
        seen = set()
        for group in self.replica_groups:
            for rank in group:
                if rank in seen:
                    raise ValueError(f"ReplicaGroup: rank {rank} is in more than one sub-group")
                seen.add(rank)

    def group_of(self, rank: int) -> List[int]:
        for group in self.replica_groups:
            if rank in group:
                return list(group)
        raise ValueError(f"rank {rank} is in no sub-group of {self.replica_groups}")


def rank_id(name=None) -> int:
    """This program's rank in the multi-rank launch (0 for a single-rank launch)."""
    return context.current().rank


def _not_yet(op):
    def fn(*args, **kwargs):
        context.fail(UnsupportedError, f"nki.collectives.{op} is not simulated yet", op=op)
    fn.__name__ = op
    return fn


for _op in ("all_gather_v", "all_to_all_v", "collective_permute_implicit",
            "collective_permute_implicit_reduce",
            "collective_permute_implicit_current_processing_rank_id"):
    globals()[_op] = _not_yet(_op)
