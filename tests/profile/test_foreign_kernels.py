"""Costing a kernel that is not registered here: from a file (the CLI) or from Python."""

import numpy as np
import pytest

from nki_kernels.cli import main
from nki_kernels.profile.foreign import cost_kernel, parse_arg

KERNEL = '''
import nki
import nki.isa as nisa
import nki.language as nl


@nki.jit
def scale_rows(x, factor):
    t = nl.ndarray(x.shape, x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    nisa.tensor_scalar(dst=t, data=t, op0=nl.multiply, operand0=factor)
    out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=t)
    return out
'''


def test_profile_a_kernel_from_a_file(tmp_path, capsys):
    path = tmp_path / "my_kernels.py"
    path.write_text(KERNEL)
    assert main(["profile", f"{path}:scale_rows", "--arg", "x=128x512:bfloat16",
                 "--arg", "factor=2.0", "--target", "trn1"]) == 0
    out = capsys.readouterr().out
    row = [line for line in out.splitlines() if line.startswith("| scale_rows |")][0].split("|")
    assert row[3].strip() == "3" and row[4].strip() == "2"      # 3 instructions, 2 DMAs
    assert int(row[6]) == 128 * 512 * 2                            # the argument's bytes
    assert float(row[7]) > 0 and "critical path" in out


def test_cost_kernel_from_python():
    from nki_kernels.simulate import jit, nisa, nl

    @jit
    def copy(x):
        t = nl.ndarray(x.shape, x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x)
        out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=t)
        return out

    x = np.arange(128 * 64, dtype=np.float32).reshape(128, 64)
    result, estimates = cost_kernel(copy, x, target="trn2")
    assert np.array_equal(result, x) and len(estimates) == 1
    assert estimates[0].dma_count == 2 and estimates[0].seconds > 0


def test_argument_specs():
    assert parse_arg("3") == 3 and parse_arg("0.5") == 0.5
    a = parse_arg("2x3:int32:arange")
    assert a.dtype == np.int32 and a.tolist() == [[0, 1, 2], [3, 4, 5]]
    assert parse_arg("4x4:bfloat16").dtype.name == "bfloat16"
    with pytest.raises(ValueError, match="must be sizes joined by x"):
        parse_arg("4y4:float32")
    with pytest.raises(ValueError, match="a number, or SHAPE:DTYPE"):
        parse_arg("abc")
