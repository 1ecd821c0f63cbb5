"""Online-softmax pieces of the decode kernel: per (request, kv head) state [G rows] in SBUF fp32.

State: negm (minus the running max m; m starts at -3.4e38, finite so exp(m_old - m_new) never sees
inf - inf),
l (running sum of exp), acc [G, D] (running P @ V). Masked logits get -3.4e38 added, so their exp
is 0 once any real logit has been seen; a chunk seen before any real logit is wiped by the
rescale exp(m_old - m_new) = 0 when one arrives.
"""

from __future__ import annotations

from nki_kernels.backend import nisa, nl

NEG_BIG = -3.4028235e38
LN_TO_LOG2 = 1.4426950408889634


def _f32(shape, name):
    return nl.ndarray(shape, nl.float32, buffer=nl.sbuf, name=name)


def init_state(G, D):
    """[negm, l, acc]: negm = -(running max), starting at -NEG_BIG (finite)."""
    negm, l, acc = _f32((G, 1), "neg_m"), _f32((G, 1), "l"), _f32((G, D), "acc")
    nisa.memset(dst=negm, value=-NEG_BIG)
    nisa.memset(dst=l, value=0.0)
    nisa.memset(dst=acc, value=0.0)
    return [negm, l, acc]


def mask_bias(c, T, G, L_g, W_g):
    """[G, T] fp32: 0 where chunk c's token is inside [W, L), else NEG_BIG."""
    pos = nl.ndarray((G, T), nl.int32, buffer=nl.sbuf, name="pos_g")
    nisa.iota(dst=pos, pattern=[[1, T]], offset=c * T, channel_multiplier=0)
    ok, late = _f32((G, T), "ok_g"), _f32((G, T), "late_g")
    nisa.tensor_scalar(dst=ok, data=pos, op0=nl.less, operand0=L_g)
    nisa.tensor_scalar(dst=late, data=pos, op0=nl.greater_equal, operand0=W_g)
    nisa.tensor_tensor(dst=ok, data1=ok, data2=late, op=nl.multiply)
    nisa.tensor_scalar(dst=ok, data=ok, op0=nl.subtract, operand0=1.0, op1=nl.multiply,
                       operand1=-NEG_BIG)
    return ok


def _scores(qT_parts, k_sb, h, D, mm_dtype):
    """PSUM [G, T] fp32 = q_group @ K_h^T, K transposed on TensorE in <= 128-row pieces."""
    T = k_sb.shape[0]
    G = qT_parts[0].shape[1]
    s_ps = nl.ndarray((G, T), nl.float32, buffer=nl.psum, name="s_ps")
    for k, d0 in enumerate(range(0, D, 128)):
        dp = min(128, D - d0)
        kT_ps = nl.ndarray((dp, T), k_sb.dtype, buffer=nl.psum, name="kT_ps")
        nisa.nc_transpose(dst=kT_ps, data=k_sb[:, h * D + d0:h * D + d0 + dp])
        kT = nl.ndarray((dp, T), k_sb.dtype, buffer=nl.sbuf, name="kT")
        nisa.activation(dst=kT, op=nl.copy, data=kT_ps)        # evict on ScalarE: VectorE is busier
        nisa.nc_matmul(dst=s_ps, stationary=qT_parts[k], moving=kT, accumulate=k > 0)
    return s_ps


def online_update(state, qT_parts, k_sb, v_sb, h, D, bias, scale, soft_cap, mm_dtype):
    """Fold one chunk into the state. VectorE: bias add, row max, running max, two rescales;
    ScalarE: scaling, exp with the row sum, alpha, PSUM evictions."""
    negm, l, acc = state
    G, T = qT_parts[0].shape[1], k_sb.shape[0]
    s_ps = _scores(qT_parts, k_sb, h, D, mm_dtype)
    s = _f32((G, T), "s")
    nisa.activation(dst=s, op=nl.copy, data=s_ps, scale=float(scale))
    if soft_cap > 0:
        nisa.activation(dst=s, op=nl.tanh, data=s, scale=1.0 / soft_cap)
        nisa.tensor_scalar(dst=s, data=s, op0=nl.multiply, operand0=float(soft_cap))
    if bias is not None:
        nisa.tensor_tensor(dst=s, data1=s, data2=bias, op=nl.add)
    negm_new = _f32((G, 1), "neg_m")
    nisa.tensor_reduce(dst=negm_new, op=nl.maximum, data=s, axis=1, negate=True)
    nisa.tensor_tensor(dst=negm_new, data1=negm_new, data2=negm, op=nl.minimum)
    p_dtype = v_sb.dtype if v_sb.dtype.itemsize > 1 else mm_dtype
    p = nl.ndarray((G, T), p_dtype, buffer=nl.sbuf, name="p")
    row_sum, alpha = _f32((G, 1), "row_sum"), _f32((G, 1), "alpha")
    nisa.activation(dst=p, op=nl.exp, data=s, bias=negm_new, reduce_op=nl.add, reduce_res=row_sum,
                    reduce_cmd=nisa.reduce_cmd.reset_reduce)
    nisa.activation(dst=alpha, op=nl.exp, data=negm, bias=negm_new, scale=-1.0)  # e^(m_old - m_new)
    nisa.scalar_tensor_tensor(dst=l, data=l, op0=nl.multiply, operand0=alpha, op1=nl.add,
                              operand1=row_sum)
    pT_ps = nl.ndarray((T, G), p_dtype, buffer=nl.psum, name="pT_ps")
    nisa.nc_transpose(dst=pT_ps, data=p)
    pT = nl.ndarray((T, G), p_dtype, buffer=nl.sbuf, name="pT")
    nisa.activation(dst=pT, op=nl.copy, data=pT_ps)
    pv = nl.ndarray((G, D), nl.float32, buffer=nl.psum, name="pv_ps")
    nisa.nc_matmul(dst=pv, stationary=pT, moving=v_sb[:, h * D:(h + 1) * D], accumulate=False)
    nisa.scalar_tensor_tensor(dst=acc, data=acc, op0=nl.multiply, operand0=alpha, op1=nl.add,
                              operand1=pv)
    state[0] = negm_new


def finalize(state, out, lse, sinks, b, h, v_scale):
    """out[b, group h] = acc / l * v_scale; lse[b, group h] = (m + ln l) * log2(e); sinks join l."""
    negm, l, acc = state
    G, D = acc.shape
    if sinks is not None:
        sk = _f32((G, 1), "sink")
        nisa.dma_copy(dst=sk, src=sinks[h * G:(h + 1) * G, :])
        nisa.activation(dst=sk, op=nl.exp, data=sk, bias=negm)
        nisa.tensor_tensor(dst=l, data1=l, data2=sk, op=nl.add)
    rl = _f32((G, 1), "inv_l")
    nisa.reciprocal(dst=rl, data=l)
    o = nl.ndarray((G, D), out.dtype, buffer=nl.sbuf, name="o")
    nisa.tensor_scalar(dst=o, data=acc, op0=nl.multiply, operand0=rl, op1=nl.multiply,
                       operand1=float(v_scale))
    nisa.dma_copy(dst=out[b, h * G:(h + 1) * G, :], src=o)
    ln_l = _f32((G, 1), "ln_l")
    nisa.activation(dst=ln_l, op=nl.log, data=l)
    nisa.tensor_tensor(dst=ln_l, data1=ln_l, data2=negm, op=nl.subtract)
    nisa.tensor_scalar(dst=ln_l, data=ln_l, op0=nl.multiply, operand0=LN_TO_LOG2)
    nisa.dma_copy(dst=lse[b, h * G:(h + 1) * G, :], src=ln_l)
