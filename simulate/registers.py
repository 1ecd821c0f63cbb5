"""Runtime registers and loops of NKI Beta 2 (executed eagerly here).

``nisa.register_alloc(x=None)`` makes a 32-bit ``VirtualRegister``; ``register_load`` reads a (1, 1)
SBUF tile into it, ``register_store`` writes it back, ``register_move`` copies. A register can be the
``scalar_offset`` of ``.ap``. ``nl.fori_loop(lower, upper, body_fun, step)`` calls ``body_fun`` with a
register holding the index; ``nl.while_loop(cond, body_fun)`` calls it while the condition register
is non-zero, ``body_fun`` returning the next condition register.
"""

from __future__ import annotations

import numpy as np

from . import context
from .errors import ValidationError


class VirtualRegister:
    """A 32-bit register value."""

    def __init__(self, value=0):
        self._value = int(np.int32(value))

    def read_value(self) -> int:
        return self._value

    def __repr__(self):
        return f"VirtualRegister({self._value})"


def register_alloc(x=None) -> VirtualRegister:
    return VirtualRegister(0 if x is None else x)


def register_move(dst: VirtualRegister, src: VirtualRegister):
    dst._value = src._value


def register_load(dst: VirtualRegister, src):
    from .access import resolve
    if src.size != 1 or src.buffer.value != "sbuf":
        context.fail(ValidationError, f"register_load needs a (1, 1) SBUF tile, got {src.shape}",
                     op="register_load", operand="src")
    dst._value = int(resolve(src, "register_load", "src").read().reshape(-1)[0])


def register_store(dst, src: VirtualRegister):
    from .access import resolve
    r = resolve(dst, "register_store", "dst")
    r.write(np.full(dst.shape, src._value).astype(dst.dtype))


def fori_loop(lower, upper, body_fun, step=1):
    for i in range(int(lower), int(upper), int(step)):
        body_fun(VirtualRegister(i))


def while_loop(init_reg, body_fun, max_iterations=1 << 24):
    cond = init_reg
    for _ in range(max_iterations):
        if cond.read_value() == 0:
            return
        cond = body_fun(cond)
    context.fail(ValidationError, f"while_loop ran {max_iterations} iterations", op="while_loop")
