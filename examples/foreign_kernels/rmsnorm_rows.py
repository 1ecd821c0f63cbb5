"""An NKI Beta 2 kernel written as an outside user would (imports the real package names).

Row-wise x * rsqrt(mean(x^2) + eps) over [N, F] in tiles of 128 rows, with nl convenience ops
for the loads/stores and ISA calls for the math.
"""

import nki
import nki.isa as nisa
import nki.language as nl


@nki.jit
def rmsnorm_rows(x, eps):
    N, F = x.shape
    out = nl.ndarray((N, F), x.dtype, buffer=nl.shared_hbm)
    for r0 in range(0, N, 128):
        rows = min(128, N - r0)
        x_sb = nl.load(x[r0:r0 + rows, :])
        sq = nl.ndarray((rows, F), nl.float32, buffer=nl.sbuf)
        ss = nl.ndarray((rows, 1), nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=sq, op=nl.square, data=x_sb, reduce_op=nl.add, reduce_res=ss,
                        reduce_cmd=nisa.reduce_cmd.reset_reduce)
        nisa.tensor_scalar(dst=ss, data=ss, op0=nl.multiply, operand0=1.0 / F, op1=nl.add, operand1=eps)
        inv = nl.ndarray((rows, 1), nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=inv, op=nl.rsqrt, data=ss)
        y = nl.ndarray((rows, F), x.dtype, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=y, data=x_sb, op0=nl.multiply, operand0=inv)
        nl.store(out[r0:r0 + rows, :], y)
    return out
