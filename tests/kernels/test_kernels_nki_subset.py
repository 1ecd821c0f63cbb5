"""Our kernels' Python is the NKI front-end's subset, flagged constructs included (what its public
source has no form for: comprehensions, lambdas, raise, del, * / ** expansion, classes off
NKIObject), so "passes in the simulator" does not hide a compile error on Trainium; and the
patterns the TensorScatter kernel writes out as lists are ``access_patterns``' own."""

import pytest

from nki_kernels.access_patterns import permute, sequence_rows, tile
from nki_kernels.paged_attention.kernel import append_attention_kernel, batch_decode_kernel
from nki_kernels.paged_kv_append.kernel import paged_kv_scatter_kernel
from nki_kernels.profile.calibration.mamba import mamba_kernel
from nki_kernels.simulate import subset
from nki_kernels.tensor_scatter import kernel as ts_kernel

KERNELS = [paged_kv_scatter_kernel, batch_decode_kernel, append_attention_kernel,
           ts_kernel.tensor_scatter_kernel, mamba_kernel]


@pytest.mark.parametrize("kernel", KERNELS, ids=lambda k: k.fn.__name__)
def test_kernel_source_is_in_the_strict_subset(kernel):
    """Nothing refused and nothing flagged, through every helper the kernel calls."""
    fn = kernel.fn
    flagged = []
    error = subset._scan(fn, fn.__code__, fn.__name__, set(), flagged)
    assert error is None
    assert flagged == []


@pytest.mark.parametrize("outer, seq, rows, inner", [(1, 1, 1, 1), (3, 10, 4, 7), (8, 4096, 1, 128)])
def test_tensor_scatter_rows_are_sequence_rows(outer, seq, rows, inner):
    assert ts_kernel._rows(outer, seq, rows, inner) == [
        list(p) for p in sequence_rows(outer, seq, rows, inner).pattern]


@pytest.mark.parametrize("outer, seq, rows, inner, cols", [
    (2, 9, 5, 7, 7), (2, 9, 5, 7, 3), (1, 4, 128, 20000, 16384), (3, 6, 2, 5, 1)])
def test_tensor_scatter_column_pieces_are_tiles_of_the_permuted_rows(outer, seq, rows, inner,
                                                                     cols):
    expected = tile(permute(sequence_rows(outer, seq, rows, inner), (1, 0, 2)), 2, cols)
    got = ts_kernel._column_pieces(outer, seq, rows, inner, cols)
    assert [(pattern, offset) for pattern, offset in got] == [
        ([list(p) for p in ap.pattern], ap.offset) for ap in expected]
