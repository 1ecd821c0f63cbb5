"""``Trace.canonicalise``: the events two concurrently run program instances recorded, in an order
free of thread timing; device-loop marks and ``depends_on`` edges follow their events."""

import itertools
import random

from nki_kernels.simulate.trace import Trace

A, B = (0,), (1,)

# per program: (op, sync key or None); each program syncs twice (three epochs)
PROGRAMS = {
    A: [("a0", None), ("a1", None), ("bar", 0), ("a2", None), ("bar", 1), ("a3", None)],
    B: [("b0", None), ("bar", 0), ("b1", None), ("b2", None), ("bar", 1)],
}
WANT = ["a0", "a1", "bar", "b0", "bar",          # epoch 0: program 0, then program 1
        "a2", "bar", "b1", "b2", "bar",          # epoch 1
        "a3"]                                    # epoch 2


def recorded(order, marks=(), edges=()):
    """A trace of PROGRAMS recorded in ``order`` (a sequence of program ids, one per event);
    ``marks``: (program, position) loop marks made before that program's position-th event;
    ``edges``: (program, consumer position, producer position) depends_on edges."""
    trace = Trace()
    made = {A: [], B: []}
    for pid in order:
        pos = len(made[pid])
        for m_pid, m_pos in marks:
            if m_pid == pid and m_pos == pos:
                trace.mark_iteration(pid)
        op, sync = PROGRAMS[pid][pos]
        details = {} if sync is None else {"sync": ("barrier", sync)}
        for e_pid, consumer, producer in edges:
            if e_pid == pid and consumer == pos:
                details["after"] = [(made[pid][producer].index, "runtime")]
        made[pid].append(trace.add(op=op, engine="gpsimd", program_id=pid, operands=(),
                                   details=details))
    for m_pid, m_pos in marks:                  # a mark after a program's last event
        if m_pos == len(PROGRAMS[m_pid]):
            trace.mark_iteration(m_pid)
    return trace


def interleavings(count=12, seed=3):
    """Random orders of the two programs' events (each program's own order kept)."""
    rng = random.Random(seed)
    seq = [A] * len(PROGRAMS[A]) + [B] * len(PROGRAMS[B])
    for _ in range(count):
        rng.shuffle(seq)
        yield list(seq)


def test_events_come_by_epoch_then_program_whatever_the_interleaving():
    for order in itertools.chain([[A] * 6 + [B] * 5, [B] * 5 + [A] * 6], interleavings()):
        trace = recorded(order)
        trace.canonicalise()
        assert [e.op for e in trace] == WANT
        assert [e.index for e in trace] == list(range(len(WANT)))
        assert [e.program_id for e in trace] == [A, A, A, B, B, A, A, B, B, B, A]


def test_loop_marks_stay_before_their_programs_next_event():
    marks = [(A, 1), (B, 2), (A, 5), (B, 5)]     # before a1, b1, a3, and after b's last event
    want = [(1, A), (7, B), (10, A), (11, B)]    # positions in WANT (11: the end)
    for order in interleavings():
        trace = recorded(order, marks)
        trace.canonicalise()
        assert trace.iteration_starts == want


def test_depends_on_edges_point_at_the_renumbered_producer():
    edges = [(A, 3, 0), (B, 3, 2)]               # a2 after a0; b2 after b1
    for order in interleavings():
        trace = recorded(order, edges=edges)
        trace.canonicalise()
        events = list(trace)
        a2 = next(e for e in events if e.op == "a2")
        b2 = next(e for e in events if e.op == "b2")
        assert a2.details["after"] == [(0, "runtime")]
        assert b2.details["after"] == [(7, "runtime")]
        assert events[0].op == "a0" and events[7].op == "b1"


def test_a_mark_of_a_program_that_recorded_nothing_goes_to_the_end():
    trace = recorded([A] * 6 + [B] * 5)
    trace.mark_iteration((2,))                 # an instance whose loop body issued nothing
    trace.canonicalise()
    assert trace.iteration_starts[-1] == (len(WANT), (2,))
