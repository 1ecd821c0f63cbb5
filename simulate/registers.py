"""Runtime registers, scalars and loops of NKI Beta 2 (executed here as real loops).

``nisa.register_alloc(x=None)`` makes a 32-bit ``VirtualRegister``; ``register_load`` reads a one-
element tile into it, ``register_store`` writes it back, ``register_move`` copies.
``nisa.scalar_load(src)`` reads a (1, 1) int32/int64 tile into an ``NkiScalar``, whose arithmetic
(+, -, *, //, %, shifts, bitwise, comparisons) yields new scalars at the source's width (int32
wraps). Registers and scalars can be the ``scalar_offset`` of ``.ap`` and loop bounds.

Loops: ``nl.fori_loop(lower, upper, body_fun, step)`` calls ``body_fun`` with a frozen register
holding the index; ``nl.while_loop(init, body_fun)`` calls it while the condition register is
non-zero; ``for i in nl.dynamic_range(start, stop, step)`` (deprecated form) iterates the same way.
Each loop's trip count is recorded in the launch trace (``Trace.loops``).

Strict like the tracer: a register or scalar in Python control flow (``if``, ``int()``,
``range()``) raises ``TypeError``, since its value is not known while the kernel is built. The one
exception is documented: ``while reg:`` on a ``VirtualRegister`` is a device loop that runs until
the register holds 0 (numbered and recorded like the loops above).

As on the device, a loop body's allocations are made once: each iteration's n-th ``nl.ndarray``
is the same buffer as the first iteration's n-th (``context.LoopFrame``), so state carried from
one iteration to the next must live in a tile allocated before the loop.
"""

from __future__ import annotations

import linecache
import sys

import numpy as np

from . import context
from .errors import ValidationError

_TRACED = ("its value is only known on the device; use nl.fori_loop / nl.while_loop, or pass it "
           "as a scalar_offset")


class _DeviceValue:
    """A value known only on the device: refuses to become a Python bool or int."""

    def __bool__(self):
        if isinstance(self, VirtualRegister) and _called_from_while():
            return _while_check(self._value != 0, sys._getframe(1))
        raise TypeError(f"a {type(self).__name__} cannot drive Python control flow: {_TRACED}")

    def __index__(self):
        raise TypeError(f"a {type(self).__name__} cannot be converted to a Python int: {_TRACED}")

    __int__ = __index__


def _called_from_while() -> bool:
    """True when the caller's line is a ``while`` statement (a device loop on a register)."""
    frame = sys._getframe(2)
    line = linecache.getline(frame.f_code.co_filename, frame.f_lineno).strip()
    return line.startswith("while ") or line.startswith("while(")


def _while_check(go: bool, frame) -> bool:
    """One condition check of a ``while reg:`` device loop: the first check at a (frame, line)
    opens the loop (numbered like the other device loops), a false one closes it."""
    open_loops = context.current().while_loops
    site = (id(frame), frame.f_lineno)
    if open_loops and open_loops[-1][0] == site:
        iterations = open_loops[-1][1]
    elif go:
        iterations = _Iterations("while").__enter__()
        open_loops.append((site, iterations))
    else:
        _record_loop("while", 0)
        return False
    if go:
        iterations.next()
        return True
    open_loops.pop()
    iterations.__exit__(None, None, None)
    return False


class VirtualRegister(_DeviceValue):
    """A 32-bit engine register."""

    def __init__(self, value=0, frozen=False):
        self._value = int(np.int32(value))
        self.frozen = frozen

    def read_value(self) -> int:
        return self._value

    def _set(self, value, op):
        if self.frozen:
            context.fail(ValidationError, "a loop's induction register is read-only", op=op,
                         operand="dst")
        self._value = int(np.array(value).astype(np.int64).astype(np.int32))

    def __repr__(self):
        return f"VirtualRegister({self._value})"


class NkiScalar(_DeviceValue):
    """One device integer (``nl.int32`` or ``nl.int64``) from ``nisa.scalar_load``."""

    def __init__(self, value, dtype="int32", is_comparison=False):
        self.dtype = np.dtype(dtype)
        self._value = int(np.array(value).astype(np.int64).astype(self.dtype))
        self.is_comparison = is_comparison

    def read_value(self) -> int:
        return self._value

    def _other(self, other, op):
        if isinstance(other, NkiScalar):
            if other.dtype != self.dtype:
                raise TypeError(f"NkiScalar {op}: widths differ ({self.dtype.name} and "
                                f"{other.dtype.name}); load both at one width")
            return other._value
        if isinstance(other, (int, np.integer)) and not isinstance(other, bool):
            return int(other)
        raise TypeError(f"NkiScalar {op}: the other operand must be an int or NkiScalar, got "
                        f"{type(other).__name__}")

    def _binary(op, fn, wide_ok=True, compare=False, reflected=False):
        def method(self, other):
            if not wide_ok and self.dtype == np.int64:
                raise TypeError(f"NkiScalar {op} is not available on int64 scalars")
            b = self._other(other, op)
            a, b = (b, self._value) if reflected else (self._value, b)
            return NkiScalar(int(fn(a, b)), self.dtype, is_comparison=compare)
        return method

    __add__ = _binary("+", lambda a, b: a + b)
    __radd__ = _binary("+", lambda a, b: a + b, reflected=True)
    __sub__ = _binary("-", lambda a, b: a - b)
    __rsub__ = _binary("-", lambda a, b: a - b, reflected=True)
    __mul__ = _binary("*", lambda a, b: a * b)
    __rmul__ = _binary("*", lambda a, b: a * b, reflected=True)
    __floordiv__ = _binary("//", lambda a, b: a // b, wide_ok=False)
    __mod__ = _binary("%", lambda a, b: a % b, wide_ok=False)
    __lshift__ = _binary("<<", lambda a, b: a << b, wide_ok=False)
    __rshift__ = _binary(">>", lambda a, b: a >> b, wide_ok=False)
    __and__ = _binary("&", lambda a, b: a & b, wide_ok=False)
    __or__ = _binary("|", lambda a, b: a | b, wide_ok=False)
    __xor__ = _binary("^", lambda a, b: a ^ b, wide_ok=False)
    __lt__ = _binary("<", lambda a, b: a < b, wide_ok=False, compare=True)
    __le__ = _binary("<=", lambda a, b: a <= b, wide_ok=False, compare=True)
    __gt__ = _binary(">", lambda a, b: a > b, wide_ok=False, compare=True)
    __ge__ = _binary(">=", lambda a, b: a >= b, wide_ok=False, compare=True)
    __eq__ = _binary("==", lambda a, b: a == b, wide_ok=False, compare=True)
    __ne__ = _binary("!=", lambda a, b: a != b, wide_ok=False, compare=True)
    __hash__ = object.__hash__
    del _binary

    def __neg__(self):
        return NkiScalar(-self._value, self.dtype)

    def __repr__(self):
        return f"NkiScalar({self._value}, {self.dtype.name})"


def _read_tile(src, op):
    from .access import resolve
    context.touch(src, context.current().issued)
    return resolve(src, op, "src").read().reshape(-1)


def register_alloc(x=None) -> VirtualRegister:
    """A fresh register holding ``x`` (default 0)."""
    return VirtualRegister(0 if x is None else _bound(x, "register_alloc", "x"))


def register_move(dst: VirtualRegister, src):
    dst._set(_bound(src, "register_move", "src"), "register_move")


def register_load(dst: VirtualRegister, src):
    """Load the single element of ``src`` (SBUF or HBM, shape [1] or [1, 1]) into ``dst``."""
    from . import dtypes
    if src.size != 1:
        context.fail(ValidationError, f"register_load needs a one-element tile, got {src.shape}",
                     op="register_load", operand="src")
    if dtypes.is_packed(src.dtype):
        context.fail(ValidationError, "packed MX x4 types cannot be loaded into a register",
                     op="register_load", operand="src")
    dst._set(_read_tile(src, "register_load")[0], "register_load")


def register_store(dst, src: VirtualRegister):
    from .access import resolve
    r = resolve(dst, "register_store", "dst")
    r.write(np.full(dst.shape, src._value).astype(dst.dtype))


def scalar_load(src) -> NkiScalar:
    """``NkiScalar`` from a (1, 1) ``nl.int32`` or ``nl.int64`` tile in SBUF or HBM."""
    if src.size != 1 or src.dtype not in (np.int32, np.int64):
        context.fail(ValidationError, f"scalar_load needs a (1, 1) int32/int64 tile, got "
                     f"{src.shape} {src.dtype.name}", op="scalar_load", operand="src")
    return NkiScalar(_read_tile(src, "scalar_load")[0], src.dtype)


def scalar_store(dst, value) -> None:
    """Write an ``NkiScalar`` into a (1, 1) tile of the same width."""
    from .access import resolve
    if not isinstance(value, NkiScalar):
        context.fail(ValidationError, "value must be an NkiScalar (use nisa.memset for a "
                     "compile-time constant)", op="scalar_store", operand="value")
    if dst.size != 1 or np.dtype(dst.dtype) != value.dtype:
        context.fail(ValidationError, f"dst must be a (1, 1) {value.dtype.name} tile, got "
                     f"{dst.shape} {dst.dtype.name}", op="scalar_store", operand="dst")
    context.touch(dst, context.current().issued)
    resolve(dst, "scalar_store", "dst").write(np.full(dst.shape, value._value, dst.dtype))


def _bound(x, op, role, int64_ok=True):
    """A loop bound / register source: a Python int, a VirtualRegister or an int32 NkiScalar."""
    if isinstance(x, VirtualRegister):
        return x._value
    if isinstance(x, NkiScalar):
        if x.dtype == np.int64 and not int64_ok:
            context.fail(ValidationError, "an int64 NkiScalar cannot bound a loop (the trip-count "
                         "comparison is 32-bit)", op=op, operand=role)
        return x._value
    if isinstance(x, (int, np.integer)) and not isinstance(x, bool):
        if not -2**31 <= int(x) < 2**31:
            context.fail(ValidationError, f"{role}={x} is not a 32-bit integer", op=op, operand=role)
        return int(x)
    context.fail(ValidationError, f"{role} must be an int, VirtualRegister or NkiScalar, got "
                 f"{type(x).__name__}", op=op, operand=role)


def _step(step, op):
    if not isinstance(step, (int, np.integer)) or isinstance(step, bool) or step <= 0:
        context.fail(ValidationError, f"step={step!r} must be a compile-time positive integer",
                     op=op, operand="step")
    return int(step)


def _record_loop(kind, iterations):
    launch = context.current()
    if launch.trace is not None:
        depth, first_pass = launch.loop_position()
        launch.trace.loops.append({"kind": kind, "iterations": iterations,
                                   "location": context.kernel_location(), "depth": depth,
                                   "first_pass": first_pass})


class _Iterations:
    """Marks the running instance as inside a device loop; ``next()`` numbers the iterations."""

    def __init__(self, kind):
        self.kind, self.count = kind, 0

    def __enter__(self):
        self.launch = context.current()
        self.frames = self.launch.loop_frames
        self.frames.append(context.LoopFrame())
        return self

    def next(self):
        self.frames[-1].next_iteration(self.count)
        self.count += 1
        if self.launch.trace is not None:
            self.launch.trace.mark_iteration(self.launch.program_id)

    def __exit__(self, *exc):
        self.frames.pop()
        if exc[0] is None:
            _record_loop(self.kind, self.count)


def _induction(value, register: bool):
    """The loop index handed to a body: a frozen register when a bound was a register, else an
    int32 NkiScalar (as the documented ``fori_loop``)."""
    return VirtualRegister(value, frozen=True) if register else NkiScalar(value, "int32")


def fori_loop(lower, upper, body_fun, step=1):
    """Run ``body_fun(i)`` for i in [lower, upper) by ``step`` on the device (a real loop). ``i``
    is a ``VirtualRegister`` when a bound is one, else an ``NkiScalar``."""
    lo, hi = _bound(lower, "fori_loop", "lower", False), _bound(upper, "fori_loop", "upper", False)
    st = _step(step, "fori_loop")
    register = isinstance(lower, VirtualRegister) or isinstance(upper, VirtualRegister)
    with _Iterations("fori_loop") as it:
        for i in range(lo, hi, st):
            it.next()
            body_fun(_induction(i, register))


def while_loop(init, body_fun, max_iterations=1 << 24):
    """Run ``cond = body_fun(cond)`` while the condition register is non-zero."""
    if not isinstance(init, VirtualRegister):
        context.fail(ValidationError, f"init must be a VirtualRegister, got {type(init).__name__}",
                     op="while_loop", operand="init")
    cond = init
    with _Iterations("while_loop") as it:
        while cond.read_value() != 0:
            if it.count == max_iterations:
                context.fail(ValidationError, f"while_loop ran {max_iterations} iterations "
                             f"without its condition register becoming 0", op="while_loop")
            it.next()
            cond = body_fun(VirtualRegister(cond.read_value(), frozen=True))
            if not isinstance(cond, VirtualRegister):
                context.fail(ValidationError, "body_fun must return the next condition register",
                             op="while_loop", operand="body_fun")


def dynamic_range(start, stop=None, step=1):
    """``for i in nl.dynamic_range(...)``: a device loop with runtime bounds; yields registers."""
    if stop is None:
        start, stop = 0, start
    lo, hi = _bound(start, "dynamic_range", "start", False), _bound(stop, "dynamic_range", "stop", False)
    st = _step(step, "dynamic_range")
    with _Iterations("dynamic_range") as it:
        for i in range(lo, hi, st):
            it.next()
            yield VirtualRegister(i, frozen=True)
