"""NKI access patterns (``[step, num]`` pairs + offset) as values: build, check, compose, coalesce."""

from .check import (AccessPatternError, check_bounds, check_not_nested, check_partition_rule,
                    free_size, reinterpret_count)
from .algebra import coalesce, contiguous_run
from .pattern import AccessPattern

__all__ = [
    "AccessPattern", "AccessPatternError", "coalesce", "contiguous_run", "check_bounds", "check_not_nested",
    "check_partition_rule", "free_size", "reinterpret_count",
]
