import numpy as np

from nki_kernels.paged_kv_append import append_paged_kv_cache

from ..paged_kv_append.conftest import make_append_case

# Tolerance per dtype (atol = rtol) against the float64 reference. fp32: kernel math is fp32;
# fp16/bf16: q, K, P and V enter the matmuls in that dtype, the output is rounded to it;
# fp8 caches: q and P in bf16, K/V exact as stored (the reference reads the same fp8 values).
TOL = {"float32": 2e-5, "float16": 2e-3, "bfloat16": 2e-2, "float8_e4m3fn": 3e-2, "float8_e5m2": 3e-2}


def make_decode_case(rng, kv_lens, page_size, H, G, D, q_dtype=np.float32, kv_dtype=np.float32,
                     layout="NHD", fused=True):
    """A NaN-filled paged cache holding kv_lens tokens per request (written by the append kernel
    in the simulator) and q [B, H*G, D]."""
    args = make_append_case(rng, kv_lens, kv_lens, page_size, H, D, dtype=kv_dtype, layout=layout,
                            fused=fused)
    append_paged_kv_cache(*args)
    q = rng.standard_normal((len(kv_lens), H * G, D)).astype(q_dtype)
    cache, kv_indices, kv_indptr, last = args[4], args[5], args[6], args[7]
    return q, cache, kv_indptr, kv_indices, last, layout


def assert_close(out, ref, lse=None, ref_lse=None, dtype="float32"):
    tol = TOL[dtype]
    np.testing.assert_allclose(out.astype(np.float64), ref.astype(np.float64), atol=tol, rtol=tol)
    if lse is not None:
        np.testing.assert_allclose(lse, ref_lse, atol=max(tol, 1e-5) * 10, rtol=tol)


def statics_spy(monkeypatch, index):
    """The static kernel argument at ``index`` (``plan.UNIT_TAIL``, ...) of each launch from
    here on, in a list."""
    from nki_kernels.paged_attention import plan
    seen = []
    kernel_arguments = plan.kernel_arguments

    def spy(*args, **kwargs):
        arrays, statics = kernel_arguments(*args, **kwargs)
        seen.append(statics[index])
        return arrays, statics
    monkeypatch.setattr(plan, "kernel_arguments", spy)
    return seen
