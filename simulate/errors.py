"""Simulator exceptions. Each names the instruction, the operand, the program id and the kernel line.

Message shape: ``dma_copy(dst=k_sb): pattern reaches flat index 8192, tensor has 8192 elements
(program_id=(3,), kernel.py:42)``.
"""

from __future__ import annotations


class SimulationError(Exception):
    """Something the hardware would reject or silently get wrong."""

    def __init__(self, message: str, *, op: str = None, operand: str = None,
                 program_id=None, location: str = None):
        self.detail, self.op, self.operand = message, op, operand
        self.program_id, self.location = program_id, location
        super().__init__(self._format())

    def _format(self) -> str:
        head = ""
        if self.op:
            head = f"{self.op}({self.operand})" if self.operand else self.op
            head += ": "
        where = []
        if self.program_id is not None:
            where.append(f"program_id={self.program_id}")
        if self.location:
            where.append(self.location)
        tail = f" ({', '.join(where)})" if where else ""
        return f"{head}{self.detail}{tail}"


class ValidationError(SimulationError, AssertionError):
    """An instruction's operands break a documented rule (shape, dtype, buffer, engine, target).

    Also an ``AssertionError``, as the official simulator's validation errors are.
    """


NkiValidationError = ValidationError


class AccessError(ValidationError):
    """An illegal access pattern (partition rule, nested ``.ap``, dtype reinterpretation)."""


class OutOfBoundsError(SimulationError, IndexError):
    """An access reaches outside its tensor (static pattern, scalar or vector offset)."""


class CapacityError(SimulationError, MemoryError):
    """Live SBUF or PSUM allocations exceed what the target has per partition."""


class TargetError(ValidationError):
    """A feature the selected target (trn1/trn2/trn3) does not have."""


class UnsupportedError(SimulationError, NotImplementedError):
    """A documented NKI feature this simulator does not model (yet)."""


class SubsetError(ValidationError):
    """Kernel code or an argument outside the Python subset the NKI compiler accepts."""


class SubsetWarning(UserWarning):
    """Kernel code the NKI front-end's public source has no form for (see ``subset``)."""


class InternalError(SimulationError):
    """An instruction met a case the simulator does not check and failed inside itself (a
    simulator bug to report); raised in place of the bare Python error, naming the instruction
    and the kernel line, with the original as its cause."""
