"""NKI access patterns (``[step, num]`` pairs + offset) as values: build, check, compose, coalesce."""

if __name__ == "access_patterns":       # imported by its old top-level name (a source checkout on sys.path)
    raise ImportError("the access patterns package installs as nki_kernels.access_patterns: "
                      "`from nki_kernels import access_patterns` (the top-level name `access_patterns` is "
                      "not used: it collides with other PyPI packages)")


from .check import (AccessPatternError, check_bounds, check_not_nested, check_partition_rule,
                    free_size, reinterpret_count)
from .algebra import coalesce, compose, contiguous_run, permute, reinterpret, split, tile
from .layouts import PagedKVLayout, page_rows, scatter_write, sequence_rows
from .pattern import AccessPattern, extent

__all__ = [
    "AccessPattern", "AccessPatternError", "coalesce", "contiguous_run", "split", "tile",
    "compose", "permute", "reinterpret", "PagedKVLayout", "page_rows", "scatter_write", "sequence_rows", "check_bounds", "check_not_nested",
    "check_partition_rule", "free_size", "reinterpret_count", "extent",
]
