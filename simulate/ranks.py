"""Multi-rank jobs: ``simulate(kernel, ranks=N)(*args)`` runs N ranks of one kernel concurrently,
one thread each, meeting at the ``nki.collectives`` operations.

Every rank is a device of its own: an array passed once is copied to each rank's HBM, so writes
a rank makes to it are not seen by the caller. Pass ``per_rank([a0, a1, ...])`` to give rank r the
value ``a_r`` (arrays there are that rank's memory and are updated in place). The call returns the
list of the ranks' results, rank 0 first. A rank that finishes or fails while its group waits for
it in a collective makes the others fail with a ``SynchronizationError`` naming the operation and
the kernel line, never a hang.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, List

import numpy as np

from .lnc import run_instances


def is_torch(value) -> bool:
    """A torch tensor (told apart without importing torch)."""
    return type(value).__module__.startswith("torch") and hasattr(value, "detach")


@dataclass(frozen=True)
class PerRank:
    """One value per rank, for an argument of a multi-rank launch."""

    values: List[Any]


def per_rank(values) -> PerRank:
    """Mark an argument of ``simulate(kernel, ranks=N)`` as one value per rank (N of them)."""
    return PerRank(list(values))


def _for_rank(value, rank, ranks, where):
    if isinstance(value, PerRank):
        if len(value.values) != ranks:
            raise ValueError(f"{where}: per_rank has {len(value.values)} values for {ranks} ranks")
        return value.values[rank]
    if isinstance(value, np.ndarray):
        return value.copy()
    if is_torch(value):
        return value.clone()
    return value


def launch_ranks(launch, fn, args, kwargs, ranks, grid=(), target=None) -> list:
    """Run ``fn`` on ``ranks`` ranks concurrently through ``launch`` (``launch.launch``, passed
    in so this module does not import it); the per-rank results, by rank."""
    if not isinstance(ranks, (int, np.integer)) or ranks < 1:
        raise ValueError(f"ranks={ranks!r}: a multi-rank launch needs a positive rank count")
    if grid and grid[0] > 1:
        raise ValueError("ranks= with kernel[2]: LNC=2 ranks are not simulated; launch each rank "
                         "as one logical core")

    def run_rank(rank, job):
        rank_args = tuple(_for_rank(a, rank, ranks, f"args[{i}]") for i, a in enumerate(args))
        rank_kwargs = {k: _for_rank(v, rank, ranks, k) for k, v in kwargs.items()}
        return launch(fn, rank_args, rank_kwargs, grid=grid, target=target, rank=rank, job=job)

    results = run_instances(run_rank, list(range(int(ranks))), noun="rank")
    return [results[r] for r in range(int(ranks))]
