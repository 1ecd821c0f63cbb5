"""The floor of an attention step: bytes, FLOPs and one ScalarE and one VectorE pass over the
scores, the largest of them; at head_dim 128 on trn2 the passes bound prefill."""

import pytest

from nki_kernels.profile.constants import hardware
from nki_kernels.profile.floor import attention_floor
from nki_kernels.registry import KERNELS, step_floor


def test_terms_by_hand():
    hw = hardware("trn2")
    f = attention_floor(hw, min_bytes=3_625_000, scores=128 * 1_200_000, head_dim=128)
    assert f.bytes_s == pytest.approx(3_625_000 / (2.9e12 / 8))          # 10 us
    assert f.scalar_s == pytest.approx(1e-3)                            # 1.2M lane cycles
    assert f.vector_s == pytest.approx(1.2e6 / 0.96e9)
    assert f.flops_s == pytest.approx(4 * 128 * 128 * 1.2e6 / 79e12)
    assert f.seconds == f.vector_s and f.bound == "VectorE"
    assert f.vector_s / f.flops_s == pytest.approx(1.25, rel=0.02)        # the reference's ratio
    two = attention_floor(hw, 3_625_000, 128 * 1_200_000, 128, cores=2)
    assert two.seconds == pytest.approx(f.seconds / 2)
    assert f.terms_us().count(" / ") == 3


def test_decode_is_bound_by_bytes_and_prefill_by_the_vector_pass():
    import numpy as np
    hw = hardware("trn2")
    layer = dict(page_size=16, kv_heads=8, group=4, head_dim=128, dtype="bfloat16")
    rng = np.random.default_rng(0)
    dec = KERNELS["paged_decode_attention"]
    i = dec.make(dict(layer, batch=4, kv_len=1000), rng)
    assert step_floor(dec, i, hw).bound == "bytes"
    pf = KERNELS["paged_prefill_attention"]
    i = pf.make(dict(layer, batch=1, q_len=512, kv_len=512), rng)
    f = step_floor(pf, i, hw)
    assert f.bound == "VectorE" and f.flops_s == pytest.approx(pf.flops(i) / hw.tensor_peak_bf16)
    app = KERNELS["paged_kv_append"]
    i = app.make(dict(batch=2, kv_len=30, append=3, page_size=16, kv_heads=2, head_dim=64), rng)
    assert step_floor(app, i, hw).bound == "bytes"


@pytest.mark.parametrize("bad", [dict(min_bytes=-1), dict(scores=-1), dict(head_dim=0),
                                 dict(cores=0)])
def test_bad_arguments_are_refused(bad):
    args = dict(min_bytes=1, scores=1, head_dim=64, cores=1, **{})
    args.update(bad)
    with pytest.raises(ValueError, match=next(iter(bad))):
        attention_floor(hardware("trn2"), **args)
