"""GpSimd gathers, sequence bounds, top-k, DMA transpose/compute, activate2 and the engine PRNGs
against the NumPy semantics of the NKI ISA reference."""

import ml_dtypes
import numpy as np
import pytest

from nki_kernels import simulate
from nki_kernels.simulate import nisa, nl

from .isa_util import events, randn, run, sb

BF16 = ml_dtypes.bfloat16


def test_nc_n_gather_per_partition(rng):
    data = randn(rng, 8, 6, 5)
    idx = rng.integers(0, 30, (8, 7)).astype(np.uint32)
    got = run(lambda d, i: _gather(d, i), data, idx)
    np.testing.assert_array_equal(got, np.take_along_axis(data.reshape(8, 30), idx.astype(int), 1))
    (e,) = events("nc_n_gather")
    assert e.engine == "gpsimd" and e.free_elems == 7


def _gather(d, i):
    out = sb((8, 7))
    nisa.nc_n_gather(dst=out, data=d, indices=i)
    return out


def test_nc_n_gather_refuses_out_of_range_and_wrong_dtype(rng):
    data = randn(rng, 4, 5)
    with pytest.raises(simulate.SimulationError, match=r"indices\[1, 0\] = 5"):
        run(lambda d, i: _gather4(d, i), data, np.array([[0], [5], [1], [2]], np.uint32))
    with pytest.raises(simulate.SimulationError, match="uint32"):
        run(lambda d, i: _gather4(d, i), data, np.zeros((4, 1), np.int32))


def _gather4(d, i):
    out = sb((4, 1))
    nisa.nc_n_gather(dst=out, data=d, indices=i)
    return out


@pytest.mark.parametrize("k,valid", [(1, None), (4, 40), (2, 64)])
def test_local_gather_matches_the_reference_example(rng, k, valid):
    src = randn(rng, 32, 64 * k)
    per_core = rng.integers(0, 64 - 1, (16, 4)).astype(np.uint16)
    index = np.tile(per_core * k, (2, 1))
    n = valid or 64

    def body(s, i):
        out = sb((32, n * k))
        nisa.local_gather(dst=out, src_buffer=s, index=i, num_elem_per_idx=k,
                          num_valid_indices=valid)
        return out
    got = run(body, src, index)
    want = np.empty((32, n, k), np.float32)
    for c in (0, 16):
        flat = index[c:c + 16].ravel(order="F")[:n].astype(int)
        want[c:c + 16] = src[c:c + 16].reshape(16, 64, k)[:, flat // k]
    np.testing.assert_array_equal(got, want.reshape(32, n * k))


def test_sequence_bounds_documented_example():
    ids = np.array([[0, 1, 1, 2, 2, 2, 0, 3, 3]], np.int32)

    def body(s):
        out = sb((1, 2, 9), nl.int32)
        nisa.sequence_bounds(dst=out, segment_ids=s)
        return out
    got = run(body, ids)
    np.testing.assert_array_equal(got[0], [[9, 1, 1, 3, 3, 3, 9, 7, 7],
                                           [-1, 3, 3, 6, 6, 6, -1, 9, 9]])


def test_topk_ascending_with_indices(rng):
    n, k = 42, 8
    snake = rng.permutation(np.arange(48)).astype(np.float32)[:48]
    src = snake.reshape(3, 16).T.astype(BF16)                  # element e at (e % 16, e // 16)

    def body(s):
        v, i = sb((16, k), nl.bfloat16), sb((16, k), nl.uint32)
        nisa.topk(val_dst=v, idx_dst=i, src=s, n=n)
        return v, i
    with simulate.use_target("trn2"):
        vals, idx = run(body, src)
    first = snake[:n]
    want = np.sort(first)[-k:]
    np.testing.assert_array_equal(vals[0].astype(np.float32), want)
    np.testing.assert_array_equal(first[idx[0].astype(int)], want)
    assert (vals == vals[0]).all()


@pytest.mark.parametrize("shape", [(16, 24), (4, 8, 6), (2, 3, 4, 5)])
def test_dma_transpose_permutations(rng, shape):
    a = randn(rng, *shape).astype(BF16)
    perm = {2: (1, 0), 3: (2, 1, 0), 4: (3, 1, 2, 0)}[len(shape)]
    out_shape = tuple(shape[p] for p in perm)

    def body(x):
        t = sb(out_shape, nl.bfloat16)
        nisa.dma_transpose(dst=t, src=x, axes=perm)
        return t
    np.testing.assert_array_equal(run(body, a), np.transpose(a, perm))
    with pytest.raises(simulate.SimulationError, match="permutes"):
        run(lambda x: _transpose_axes(x, out_shape), a)


def _transpose_axes(x, out_shape):
    t = sb(out_shape, nl.bfloat16)
    nisa.dma_transpose(dst=t, src=x, axes=tuple(range(len(out_shape))))
    return t


def test_dma_transpose_hwdge_limits(rng):
    a = randn(rng, 8, 24).astype(BF16)

    def body(x):
        t = sb((24, 8), nl.bfloat16)
        nisa.dma_transpose(dst=t, src=x, dge_mode=nisa.dge_mode.hwdge)
        return t
    with simulate.use_target("trn2"), pytest.raises(simulate.SimulationError, match="shape\\[0\\] == 16"):
        run(body, a)
    with simulate.use_target("trn1"), pytest.raises(simulate.SimulationError, match="NeuronCore-v3"):
        run(body, a)


def test_dma_compute_adds_in_fp32(rng):
    a, b, c = (randn(rng, 4, 6) for _ in range(3))

    def body(x, y, z):
        t = sb((4, 6), nl.bfloat16)
        nisa.dma_compute(dst=t, srcs=[x, y, z], reduce_op=nl.add)
        return t
    got = run(body, a, b, c)
    np.testing.assert_array_equal(got, (a + b + c).astype(BF16))
    with pytest.raises(simulate.SimulationError, match="only nl.add"):
        run(lambda x, y, z: _compute(x, y, nl.multiply), a, b, c)
    with pytest.raises(simulate.SimulationError, match="all 1.0"):
        run(lambda x, y, z: _compute(x, y, nl.add, [1.0, 2.0]), a, b, c)


def _compute(x, y, op, scales=None):
    t = sb((4, 6))
    nisa.dma_compute(dst=t, srcs=[x, y], reduce_op=op, scales=scales)
    return t


def test_activate2_pipeline_on_v4_only(rng):
    a = randn(rng, 5, 7)
    scale = np.full((5, 1), 0.5, np.float32)

    def body(x, s):
        t, r = sb((5, 7)), sb((5, 1))
        nisa.activate2(dst=t, op=nl.exp, data=x, imm0=s, imm1=2.0, op0=nl.multiply,
                       op1=nl.subtract, reverse1=True, reduce_op=nl.add, reduce_res=r,
                       reduce_cmd=nisa.reduce_cmd.reset_reduce)
        return t, r
    with simulate.use_target("trn3"):
        out, total = run(body, a, scale)
    want = np.exp(2.0 - a * 0.5)
    np.testing.assert_allclose(out, want, rtol=1e-6)
    np.testing.assert_allclose(total[:, 0], want.sum(1), rtol=1e-5)
    with simulate.use_target("trn2"), pytest.raises(simulate.SimulationError, match="NeuronCore-v4"):
        run(body, a, scale)


def _random_bits(seed_state=None, target="trn2"):
    def body():
        t = sb((4, 64), nl.uint32)
        nisa.rng(dst=t)
        return t
    with simulate.use_target(target):
        return run(body)


def test_rng_is_reproducible_and_spread():
    a, b = _random_bits(), _random_bits()
    np.testing.assert_array_equal(a, b)                # each launch starts from the same state
    assert len(np.unique(a)) == a.size                 # 256 distinct 32-bit words
    assert not (a[0] == a[1]).all()                    # lanes differ
    bits = np.unpackbits(a.view(np.uint8))
    assert 0.45 < bits.mean() < 0.55


def test_set_rng_seed_and_state_round_trip():
    def body(seed):
        t1, t2 = sb((2, 8), nl.uint16), sb((2, 8), nl.uint16)
        nisa.set_rng_seed(src_seeds=seed)
        nisa.rng(dst=t1)
        nisa.set_rng_seed(src_seeds=seed)
        nisa.rng(dst=t2)
        return t1, t2
    x, y = run(body, np.array([[1234]], np.uint32))
    np.testing.assert_array_equal(x, y)

    def state(_):
        s, t1, t2 = sb((3, 6), nl.uint32), sb((3, 5), nl.int32), sb((3, 5), nl.int32)
        nisa.rand_get_state(dst=s)
        nisa.rng(dst=t1, engine=nisa.engine.gpsimd)
        nisa.rand_set_state(src_seeds=s)
        nisa.rng(dst=t2, engine=nisa.engine.gpsimd)
        return t1, t2
    with simulate.use_target("trn2"):
        p, q = run(state, np.zeros((1, 1), np.float32))
    np.testing.assert_array_equal(p, q)
    with simulate.use_target("trn1"), pytest.raises(simulate.SimulationError, match="NeuronCore-v3"):
        run(state, np.zeros((1, 1), np.float32))


def test_dropout_rate_and_extremes(rng):
    a = randn(rng, 64, 256) + 10.0
    probs = np.repeat([[0.0], [0.3], [1.0], [0.8]], 16, axis=0).astype(np.float32)

    def body(x, p):
        t = sb((64, 256))
        nisa.dropout(dst=t, data=x, prob=p)
        return t
    out = run(body, a, probs)
    kept = out != 0
    np.testing.assert_array_equal(out[kept], a[kept])
    rates = [1 - kept[i:i + 16].mean() for i in (0, 16, 32, 48)]
    assert rates[0] == 0 and rates[2] == 1
    assert abs(rates[1] - 0.3) < 0.03 and abs(rates[3] - 0.8) < 0.03


def test_rand2_uniform_in_range():
    def body():
        t = sb((8, 512))
        nisa.rand2(dst=t, min=-2.0, max=3.0)
        return t
    with simulate.use_target("trn3"):
        out = run(body)
    assert out.min() >= -2.0 and out.max() <= 3.0
    assert abs(out.mean() - 0.5) < 0.1


def test_language_rms_norm_dropout_gather_flattened(rng):
    x, w = randn(rng, 6, 32), randn(rng, 6, 32)
    idx = rng.integers(0, 32, (6, 5)).astype(np.uint32)

    def body(a, b, i):
        return (nl.rms_norm(a, b, axis=1, n=32), nl.dropout(a, 0.0),
                nl.gather_flattened(a, i))
    normed, kept, gathered = run(body, x, w, idx)
    want = x / np.sqrt((x.astype(np.float64) ** 2).mean(1, keepdims=True) + 1e-6) * w
    np.testing.assert_allclose(normed, want, rtol=2e-5, atol=2e-5)
    np.testing.assert_array_equal(kept, x)
    np.testing.assert_array_equal(gathered, np.take_along_axis(x, idx.astype(int), 1))
