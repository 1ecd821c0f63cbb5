"""``nki.collectives`` across the ranks of ``simulate(kernel, ranks=N)``, against NumPy."""

import ml_dtypes
import numpy as np
import pytest

from nki_kernels.simulate import jit, nisa, nl, per_rank, simulate
from nki_kernels.simulate import collectives as cc
from nki_kernels.simulate.errors import ValidationError
from nki_kernels.simulate.lnc import SynchronizationError

RANKS = 4


def _hbm_op(collective, out_rows_of, **kw):
    @jit
    def k(x):
        out = nl.ndarray((out_rows_of(x.shape[0]),) + tuple(x.shape[1:]), x.dtype,
                         buffer=nl.shared_hbm)
        collective(srcs=[x], dsts=[out], **kw)
        return out
    return k


def _inputs(dtype=np.float32, rows=8, cols=5):
    rng = np.random.default_rng(7)
    return [rng.standard_normal((rows, cols)).astype(dtype) for _ in range(RANKS)]


@pytest.mark.parametrize("op, fn", [(nl.add, np.add), (nl.maximum, np.maximum),
                                    (nl.minimum, np.minimum)])
def test_all_reduce_on_hbm_in_two_groups(op, fn):
    group = cc.ReplicaGroup([[0, 2], [1, 3]])
    k = _hbm_op(cc.all_reduce, lambda n: n, replica_group=group, op=op)
    xs = _inputs()
    got = simulate(k, ranks=RANKS)(per_rank(xs))
    for r in range(RANKS):
        partner = {0: 2, 2: 0, 1: 3, 3: 1}[r]
        lo, hi = min(r, partner), max(r, partner)
        np.testing.assert_array_equal(got[r], fn(xs[lo], xs[hi]))


def test_all_reduce_bf16_sums_in_fp32_then_rounds():
    xs = _inputs(ml_dtypes.bfloat16)
    k = _hbm_op(cc.all_reduce, lambda n: n, replica_group=[[0, 1, 2, 3]], op=nl.add)
    got = simulate(k, ranks=RANKS)(per_rank(xs))
    want = sum(x.astype(np.float32) for x in xs).astype(ml_dtypes.bfloat16)
    for g in got:
        np.testing.assert_array_equal(g, want)


def test_all_gather_and_reduce_scatter_and_all_to_all_on_hbm():
    xs = _inputs(rows=8)
    everyone = cc.ReplicaGroup([[3, 1, 0, 2]])           # group order decides the layout
    order = [3, 1, 0, 2]
    gather = simulate(_hbm_op(cc.all_gather, lambda n: n * RANKS, replica_group=everyone,
                              collective_dim=0), ranks=RANKS)(per_rank(xs))
    for g in gather:
        np.testing.assert_array_equal(g, np.concatenate([xs[r] for r in order]))
    scatter = simulate(_hbm_op(cc.reduce_scatter, lambda n: n // RANKS, replica_group=everyone,
                               collective_dim=0, op=nl.add), ranks=RANKS)(per_rank(xs))
    total = np.sum(np.stack(xs), axis=0, dtype=np.float32)
    for r in range(RANKS):
        k = order.index(r)
        np.testing.assert_allclose(scatter[r], total[2 * k:2 * k + 2], rtol=1e-6)
    a2a = simulate(_hbm_op(cc.all_to_all, lambda n: n, replica_group=everyone,
                           collective_dim=0), ranks=RANKS)(per_rank(xs))
    for r in range(RANKS):
        k = order.index(r)
        want = np.concatenate([xs[s][2 * k:2 * k + 2] for s in order])
        np.testing.assert_array_equal(a2a[r], want)


def test_collective_permute_ring_and_untargeted_rank():
    @jit
    def k(x, out):
        cc.collective_permute(srcs=[x], dsts=[out], source_target_pairs=[(0, 1), (1, 2), (2, 0)])
        return out
    xs = _inputs()
    outs = [np.full_like(xs[0], -1.0) for _ in range(RANKS)]
    simulate(k, ranks=RANKS)(per_rank(xs), per_rank(outs))
    np.testing.assert_array_equal(outs[1], xs[0])
    np.testing.assert_array_equal(outs[2], xs[1])
    np.testing.assert_array_equal(outs[0], xs[2])
    assert (outs[3] == -1).all()                 # rank 3 is in no pair: untouched


def test_all_gather_in_sbuf_along_the_free_dim_and_rank_id():
    @jit
    def k(x):
        t = nl.ndarray((8, 5), nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x)
        nisa.tensor_scalar(dst=t, data=t, op0=nl.add, operand0=float(cc.rank_id()) * 100)
        g = nl.ndarray((8, 5 * RANKS), nl.float32, buffer=nl.sbuf)
        cc.all_gather(srcs=[t], dsts=[g], replica_group=[[0, 1, 2, 3]], collective_dim=1)
        out = nl.ndarray((8, 5 * RANKS), nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=g)
        return out
    x = _inputs()[0]
    got = simulate(k, ranks=RANKS)(x)                  # one array, copied to every rank
    want = np.concatenate([x + 100 * r for r in range(RANKS)], axis=1)
    for g in got:
        np.testing.assert_array_equal(g, want)


def test_documented_limits_are_refused():
    x = np.zeros((8, 5), np.float32)

    @jit
    def sbuf_coalesced(a):
        t = [nl.ndarray((8, 5), nl.float32, buffer=nl.sbuf) for _ in range(2)]
        cc.all_reduce(srcs=t, dsts=t, replica_group=[[0, 1]], op=nl.add)
    with pytest.raises(ValidationError, match="coalesced"):
        simulate(sbuf_coalesced, ranks=2)(x)

    with pytest.raises(ValidationError, match="op=.*must be nl.add"):
        simulate(_hbm_op(cc.all_reduce, lambda n: n, replica_group=[[0, 1]], op=nl.multiply),
                 ranks=2)(x)
    with pytest.raises(ValidationError, match="collective_dim=1"):
        simulate(_hbm_op(cc.all_gather, lambda n: n, replica_group=[[0, 1]], collective_dim=1),
                 ranks=2)(x)
    with pytest.raises(ValidationError, match="the job has 1 rank"):
        _hbm_op(cc.all_reduce, lambda n: n, replica_group=[[0, 1]], op=nl.add)(x)


def test_a_rank_that_skips_the_collective_fails_its_group_without_hanging():
    @jit
    def k(x):
        out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
        if cc.rank_id() != 1:
            cc.all_reduce(srcs=[x], dsts=[out], replica_group=[[0, 1]], op=nl.add)
        return out
    with pytest.raises(SynchronizationError, match="rank 1, which finished"):
        simulate(k, ranks=2)(np.zeros((4, 4), np.float32))


def test_ranks_passing_different_shapes_are_an_error():
    k = _hbm_op(cc.all_reduce, lambda n: n, replica_group=[[0, 1]], op=nl.add)
    with pytest.raises(SynchronizationError, match="same group, shapes and dtypes"):
        simulate(k, ranks=2)(per_rank([np.zeros((4, 4), np.float32),
                                       np.zeros((8, 4), np.float32)]))
