"""Calibration of the cost model against figures AWS publishes (``published.py``)."""

from .published import FIGURES, Figure, run_all

__all__ = ["FIGURES", "Figure", "run_all"]
