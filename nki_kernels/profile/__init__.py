"""Cost model over the simulator's instruction trace, and timeline export."""

from .constants import HARDWARE, TRN1, TRN2, Hardware, hardware
from .cost_model import Estimate, estimate, instruction_seconds
from .timeline import chrome_trace, png_timeline

__all__ = ["Hardware", "hardware", "HARDWARE", "TRN1", "TRN2", "Estimate", "estimate",
           "instruction_seconds", "chrome_trace", "png_timeline"]
