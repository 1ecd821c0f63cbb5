"""Two-core (LNC=2) execution: the program instances of one launch run concurrently, one thread
each, and meet at ``nisa.sendrecv`` and ``nisa.core_barrier``.

A ``Meeting`` pairs up the instances: each arrival posts its payload under a key (barrier number,
or pipe and sequence number) and waits until every partner has posted under the same key. An
instance that finishes or fails without arriving turns its partners' wait into a
``SynchronizationError`` naming the instruction, the program id and the kernel line, never a hang.
"""

from __future__ import annotations

import threading

import numpy as np

from . import context
from .errors import SimulationError, TargetError, ValidationError


class SynchronizationError(SimulationError):
    """An instance waits for a partner that can never arrive (finished, failed or mismatched)."""


class Meeting:
    """Rendezvous state of one launch's program instances."""

    def __init__(self, instances, noun="program"):
        self.noun = noun                     # "program" (LNC=2 instances) or "rank"
        self.cond = threading.Condition()
        self.posts = {}                      # key -> {instance: payload}
        self.done = {}                       # instance -> "finished" | "failed"
        self.counters = {}                   # (instance, kind) -> count
        self.instances = list(instances)

    def next_number(self, instance, kind):
        with self.cond:
            n = self.counters.get((instance, kind), 0)
            self.counters[(instance, kind)] = n + 1
            return n

    def arrive(self, key, instance, payload, partners, what):
        """Post ``payload`` under ``key``; return {partner: payload} once all partners posted."""
        with self.cond:
            self.posts.setdefault(key, {})[instance] = payload
            self.cond.notify_all()
            while True:
                got = self.posts.get(key, {})
                if all(p in got for p in partners):
                    return {p: got[p] for p in partners}
                gone = [p for p in partners if p not in got and p in self.done]
                if gone:
                    p = gone[0]
                    context.fail(SynchronizationError,
                                 f"waits for {self.noun} {p}, which {self.done[p]} without reaching "
                                 f"the matching {what}", op=what)
                self.cond.wait(timeout=0.5)

    def leave(self, instance, failed):
        with self.cond:
            self.done[instance] = "failed" if failed else "finished"
            self.cond.notify_all()


def _meeting(op):
    launch = context.current()
    meeting = getattr(launch, "meeting", None)
    target = launch.target
    if target.nc_version < 3:
        context.fail(TargetError, f"{op} needs NeuronCore-v3+ with LNC=2 (target {target.name})",
                     op=op)
    if meeting is None or len(meeting.instances) != 2:
        context.fail(ValidationError, f"{op} needs an LNC=2 launch (kernel[2](...)); this launch "
                     f"has grid {launch.grid or (1,)}", op=op)
    return launch, meeting


def core_barrier(data, cores, engine=None, name=None):
    """Wait until every core in ``cores`` (only (0, 1)) reaches its barrier of the same number."""
    from .isa.core import record
    from .access import resolve
    op = "core_barrier"
    launch, meeting = _meeting(op)
    if tuple(cores) != (0, 1):
        context.fail(ValidationError, f"cores={tuple(cores)}: only (0, 1) is supported", op=op,
                     operand="cores")
    r = resolve(data, op, "data")
    if r.buffer != "shared_hbm":
        context.fail(ValidationError, f"data must be in shared HBM, got {r.buffer}", op=op,
                     operand="data")
    me = launch.program_id
    n = meeting.next_number(me, "barrier")
    others = [(c,) for c in cores if (c,) != me]
    meeting.arrive(("barrier", n), me, None, others, op)
    return record(op, "gpsimd", {"data": r}, name=name, details={"sync": ("barrier", n)})


GPSIMD_DMA_LIMIT = {4: 1024, 2: 512, 1: 256}      # bytes per partition by element size


def sendrecv(src, dst, send_to_rank, recv_from_rank, pipe_id, dma_engine=None, name=None):
    """Send ``src`` to ``send_to_rank``'s ``dst`` while receiving ``recv_from_rank``'s ``src``
    into this core's ``dst`` (SBUF tiles of one dtype and shape)."""
    from .access import resolve
    from .isa.core import record
    from .isa.enums import dma_engine as dma_enum
    op = "sendrecv"
    launch, meeting = _meeting(op)
    s, d = resolve(src, op, "src"), resolve(dst, op, "dst")
    for role, r in (("src", s), ("dst", d)):
        if r.buffer != "sbuf":
            context.fail(ValidationError, f"{role} must be in SBUF, got {r.buffer}", op=op,
                         operand=role)
    if src.dtype != dst.dtype or tuple(src.shape) != tuple(dst.shape):
        context.fail(ValidationError, f"src {src.shape} {src.dtype.name} and dst {dst.shape} "
                     f"{dst.dtype.name} must match", op=op, operand="dst")
    for role, rank in (("send_to_rank", send_to_rank), ("recv_from_rank", recv_from_rank)):
        if rank not in (0, 1):
            context.fail(ValidationError, f"{role}={rank!r} must be 0 or 1", op=op, operand=role)
    if dma_engine is not None and dma_enum(dma_engine) == dma_enum.gpsimd_dma:
        per_partition = int(np.prod(src.shape[1:])) * src.dtype.itemsize
        limit = GPSIMD_DMA_LIMIT[src.dtype.itemsize if src.dtype.itemsize in (1, 2) else 4]
        if per_partition > limit:
            context.fail(ValidationError, f"gpsimd_dma moves at most {limit} B per partition for "
                         f"{src.dtype.name}, src has {per_partition}", op=op, operand="src")
    me = launch.program_id
    n = meeting.next_number(me, ("pipe", pipe_id))
    values = s.read().copy()
    got = meeting.arrive(("sendrecv", pipe_id, n), me, (values, send_to_rank, recv_from_rank),
                         [(0,), (1,)], op)
    sent, to, _ = got[(int(recv_from_rank),)]
    if to != me[0]:
        context.fail(SynchronizationError, f"receives from program {recv_from_rank}, which sends "
                     f"to program {to} on pipe {pipe_id}", op=op, operand="recv_from_rank")
    d.write(sent.reshape(dst.shape))
    return record(op, "dma", {"dst": d, "src": s}, name=name,
                  dma_bytes=int(values.size) * src.dtype.itemsize,
                  details={"sync": ("sendrecv", pipe_id, n)})


def run_instances(run_one, instances, noun="program"):
    """Run ``run_one(pid, meeting)`` for each instance concurrently; return results by instance,
    re-raising the first failure that is not a consequence of another (a partner's
    SynchronizationError)."""
    meeting = Meeting(instances, noun)
    results, errors = {}, {}

    def body(pid):
        failed = True
        try:
            results[pid] = run_one(pid, meeting)
            failed = False
        except BaseException as err:                 # reported after every thread has ended
            errors[pid] = err
        finally:
            meeting.leave(pid, failed)

    threads = [threading.Thread(target=body, args=(pid,), name=f"nki-{noun}-{pid}")
               for pid in instances]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        root = [e for e in errors.values() if not isinstance(e, SynchronizationError)]
        raise (root or list(errors.values()))[0]
    return results
