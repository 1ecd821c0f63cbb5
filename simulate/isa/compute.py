"""Compute-engine instructions (TensorE, VectorE, ScalarE, GpSimd), gathered for ``nki.isa``."""

from .activation import activate2, activation, activation_reduce, exponential
from .dma_transform import dma_compute, dma_transpose
from .gather import local_gather, nc_n_gather, sequence_bounds, topk
from .random import dropout, rand2, rand_get_state, rand_set_state, rng, set_rng_seed
from .find8 import nc_find_index8, nc_match_replace8
from .elementwise import (reciprocal, scalar_tensor_tensor, tensor_copy_predicated, tensor_scalar,
                          tensor_tensor)
from .gpsimd import nonzero_with_count
from .matmul import nc_matmul, nc_transpose
from .mx import nc_matmul_mx, quantize_mx
from .reduce import (bn_aggr, bn_stats, max8, tensor_partition_reduce, tensor_reduce,
                     tensor_scalar_reduce)
from .scan import tensor_scalar_cumulative, tensor_tensor_scan
from .shuffle import nc_stream_shuffle
from .selection import affine_select, range_select, select_reduce

__all__ = [
    "activate2", "dma_compute", "dma_transpose", "local_gather", "nc_n_gather",
    "sequence_bounds", "topk", "dropout", "rand2", "rand_get_state", "rand_set_state", "rng",
    "set_rng_seed",
    "activation", "activation_reduce", "exponential", "reciprocal", "scalar_tensor_tensor",
    "tensor_copy_predicated", "tensor_scalar", "tensor_tensor", "nc_matmul", "nc_transpose",
    "nc_matmul_mx", "quantize_mx",
    "bn_aggr", "bn_stats", "max8", "tensor_partition_reduce", "tensor_reduce",
    "tensor_scalar_reduce", "affine_select", "range_select", "select_reduce",
    "nc_find_index8", "nc_match_replace8", "tensor_scalar_cumulative", "tensor_tensor_scan", "nonzero_with_count", "nc_stream_shuffle",
]
