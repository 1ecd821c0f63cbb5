"""Which destination rows a DMA writes when sources skip rows (``oob_mode.skip``)."""

from __future__ import annotations

from ..access import rows_in_both
from .core import fail


def source_rows(sources, dst_rows: int, op: str):
    """The destination rows every source has (bool [dst_rows], None = all): a source row an
    indirect access skipped (out of bounds under ``oob_mode.skip``) is a destination row not
    written. ``sources``: [(operand name, Resolved)]; a source that skips rows must have
    ``dst_rows`` rows."""
    rows = None
    for role, r in sources:
        if r.row_mask is None:
            continue
        if r.shape[0] != dst_rows:
            fail(f"skipped rows of {role} need dst rows to match: dst dim 0 is {dst_rows}, "
                 f"{role} has {r.shape[0]} rows", op, role)
        rows = rows_in_both(rows, r.row_mask)
    return rows
