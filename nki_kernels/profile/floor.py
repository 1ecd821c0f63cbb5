"""The physical floor of an attention step: the largest of what its bytes, its FLOPs and the two
elementwise passes no softmax avoids take on one NeuronCore (or the cores used).

- bytes: what must cross HBM (every attended K/V row read once, new rows written, q read, out
  written) over the core's HBM bandwidth;
- FLOPs: 4 x head_dim per score (QK^T and PV, a multiply-add each) over TensorE's bf16 peak;
- ScalarE: one pass over the scores (the exponentials) at one element per lane per cycle;
- VectorE: one pass over the scores (the row maxima) at one element per lane per cycle.

At head_dim 128 on trn2 the ScalarE pass equals the FLOPs term and the VectorE pass is 1.25x it,
so a prefill step's floor is its VectorE pass; a decode step's is its bytes. A score is one
(query token, query head, visible key) triple.
"""

from __future__ import annotations

from dataclasses import dataclass

LANES = 128


@dataclass(frozen=True)
class Floor:
    """Seconds per term (see the module docstring); ``seconds`` is the largest."""

    bytes_s: float
    flops_s: float
    scalar_s: float
    vector_s: float

    @property
    def seconds(self) -> float:
        return max(self.bytes_s, self.flops_s, self.scalar_s, self.vector_s)

    @property
    def bound(self) -> str:
        """Which term sets the floor."""
        terms = {"bytes": self.bytes_s, "FLOPs": self.flops_s, "ScalarE": self.scalar_s,
                 "VectorE": self.vector_s}
        return max(terms, key=terms.get)

    def terms_us(self) -> str:
        """'bytes / FLOPs / ScalarE / VectorE' in microseconds, for a table cell."""
        return " / ".join(f"{1e6 * t:.1f}" for t in (self.bytes_s, self.flops_s, self.scalar_s,
                                                       self.vector_s))


def attention_floor(hw, min_bytes: int, scores: int, head_dim: int, cores: int = 1) -> Floor:
    """The floor of a step moving ``min_bytes`` over HBM and computing ``scores`` scores of
    ``head_dim`` on ``cores`` NeuronCores of hardware ``hw`` (``profile.constants.Hardware``)."""
    if min_bytes < 0 or scores < 0 or head_dim <= 0 or cores <= 0:
        raise ValueError(f"min_bytes={min_bytes}, scores={scores} must be >= 0 and "
                         f"head_dim={head_dim}, cores={cores} > 0")
    return Floor(bytes_s=min_bytes / (hw.hbm_bytes_per_s * cores),
                 flops_s=4 * scores * head_dim / (hw.tensor_peak_bf16 * cores),
                 scalar_s=scores / (LANES * hw.scalar_hz * cores),
                 vector_s=scores / (LANES * hw.vector_hz * cores))
