"""``nki.compiler.kernel_builder.compile_kernel`` as the NKI language guide calls it: a kernel
function, named inputs and outputs (written in place) and a function passed as a hyperparameter."""

import numpy as np
import pytest

from nki_kernels import simulate
from nki_kernels.simulate import nisa, nl


def tiled_process(input_tensor, output_tensor, tile_fn):
    for i in range(input_tensor.shape[0] // 128):
        t = nl.ndarray((128, input_tensor.shape[1]), input_tensor.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=input_tensor[i * 128:(i + 1) * 128, :])
        r = nl.ndarray(t.shape, t.dtype, buffer=nl.sbuf)
        tile_fn(r, t)
        nisa.dma_copy(dst=output_tensor[i * 128:(i + 1) * 128, :], src=r)


def relu(dst, src):
    nisa.activation(dst=dst, data=src, op=nl.relu)


def halve(dst, src):
    nisa.tensor_scalar(dst=dst, data=src, op0=nl.multiply, operand0=0.5)


@pytest.mark.parametrize("tile_fn, expect", [(relu, lambda x: np.maximum(x, 0)),
                                             (halve, lambda x: x / 2)])
def test_compile_kernel_specialises_on_a_function(rng, tile_fn, expect):
    with simulate.patched():
        from nki.compiler.kernel_builder import compile_kernel
        x = rng.standard_normal((256, 64)).astype(np.float32)
        y = np.zeros_like(x)
        compile_kernel(tiled_process, inputs={"input_tensor": x}, outputs={"output_tensor": y},
                       compile_opts=None, tile_fn=tile_fn)
    np.testing.assert_array_equal(y, expect(x))


def test_compile_kernel_names_what_it_cannot_bind(rng):
    from nki_kernels.simulate.kernel_builder import compile_kernel
    x = np.zeros((128, 4), np.float32)
    with pytest.raises(TypeError, match="no parameter"):
        compile_kernel(tiled_process, inputs={"input_tensor": x, "bias": x},
                       outputs={"output_tensor": x}, tile_fn=relu)
    with pytest.raises(ValueError, match="named twice"):
        compile_kernel(tiled_process, inputs={"input_tensor": x},
                       outputs={"input_tensor": x}, tile_fn=relu)
