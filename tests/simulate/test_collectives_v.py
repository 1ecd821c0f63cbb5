"""``all_gather_v`` / ``all_to_all_v`` (sizes from a uint32 metadata tensor, read at run time)
and the ring permutes, across the ranks of ``simulate(kernel, ranks=N)``, against NumPy."""

import numpy as np
import pytest

from nki_kernels.simulate import jit, nisa, nl, per_rank, simulate
from nki_kernels.simulate import collectives as cc
from nki_kernels.simulate.errors import ValidationError
from nki_kernels.simulate.lnc import SynchronizationError

RANKS = 4
ORDER = [3, 1, 0, 2]                   # a rank-list whose order is not the ranks' order


def _v_kernel(collective, **kw):
    @jit
    def k(src, dst, meta):
        collective(srcs=[src], dsts=[dst], replica_group=cc.ReplicaGroup([ORDER]),
                   metadata_tensor=meta, **kw)
        return dst, meta
    return k


def _meta(send_counts, send_displs, recv_displs=None):
    rows = [send_counts, send_displs, [7] * RANKS] + ([recv_displs] if recv_displs else [])
    return np.array(rows, np.uint32)


def _srcs(size=6):
    return [np.arange(size, dtype=np.float32) + 100 * r for r in range(RANKS)]


def test_all_gather_v_broadcasts_one_chunk_per_rank_into_equal_slots():
    srcs = _srcs()
    dsts = [np.full(4 * 6, -1.0, np.float32) for _ in range(RANKS)]
    # rank r sends r + 1 elements from element 1; only column 0 of rows 0/1 is read
    metas = [_meta([r + 1, 0, 9, 9], [1, 5, 5, 5]) for r in range(RANKS)]
    got = simulate(_v_kernel(cc.all_gather_v), ranks=RANKS)(per_rank(srcs), per_rank(dsts),
                                                           per_rank(metas))
    for r in range(RANKS):
        dst, meta = got[r]
        want = np.full(24, -1.0, np.float32)
        for j, s in enumerate(ORDER):
            want[6 * j:6 * j + s + 1] = srcs[s][1:s + 2]
        np.testing.assert_array_equal(dst, want)
        np.testing.assert_array_equal(meta[2], [s + 1 for s in ORDER])   # recv counts written
        np.testing.assert_array_equal(meta[:2], metas[r][:2])


def test_all_gather_v_with_recv_displs_packs_chunks_and_known_counts_stay():
    srcs = _srcs()
    dsts = [np.zeros(10, np.float32) for _ in range(RANKS)]
    sizes = {s: s + 1 for s in ORDER}                  # 4, 2, 1, 3 elements in rank-list order
    displs = list(np.cumsum([0] + [sizes[s] for s in ORDER])[:-1])
    metas = [_meta([sizes[r]] * 4, [0] * 4, displs) for r in range(RANKS)]
    got = simulate(_v_kernel(cc.all_gather_v, has_rdispls=True, recv_counts_known=True),
                   ranks=RANKS)(per_rank(srcs), per_rank(dsts), per_rank(metas))
    want = np.concatenate([srcs[s][:sizes[s]] for s in ORDER])
    for r in range(RANKS):
        np.testing.assert_array_equal(got[r][0], want)
        assert (got[r][1][2] == 7).all()                  # row 2 untouched


def test_all_to_all_v_sends_each_rank_its_own_chunk():
    srcs = [np.arange(12, dtype=np.int32) + 100 * r for r in range(RANKS)]
    dsts = [np.full(4 * 3, -5, np.int32) for _ in range(RANKS)]
    # rank r sends (j + r) % 3 + 1 elements to the j-th rank of ORDER, from element 3 * j
    counts = {r: [(j + r) % 3 + 1 for j in range(RANKS)] for r in range(RANKS)}
    metas = [_meta(counts[r], [3 * j for j in range(RANKS)]) for r in range(RANKS)]
    got = simulate(_v_kernel(cc.all_to_all_v), ranks=RANKS)(per_rank(srcs), per_rank(dsts),
                                                           per_rank(metas))
    for r in range(RANKS):
        me = ORDER.index(r)
        want = np.full(12, -5, np.int32)
        for i, s in enumerate(ORDER):
            n = counts[s][me]
            want[3 * i:3 * i + n] = srcs[s][3 * me:3 * me + n]
        np.testing.assert_array_equal(got[r][0], want)
        np.testing.assert_array_equal(got[r][1][2], [counts[s][me] for s in ORDER])


@pytest.mark.parametrize("collective, meta, match", [
    (cc.all_gather_v, _meta([7, 0, 0, 0], [0] * 4),
     r"send_counts\[0\] = 7 from send_displs\[0\] = 0: elements \[0, 7\) are outside srcs\[0\] "
     r"\(6 elements\)"),
    (cc.all_gather_v, _meta([2, 0, 0, 0], [5, 0, 0, 0]), r"\[5, 7\) are outside"),
    (cc.all_to_all_v, _meta([0, 0, 3, 0], [0, 0, 4, 0]),
     r"send_counts\[2\] = 3 from send_displs\[2\] = 4: elements \[4, 7\)"),
    (cc.all_gather_v, _meta([4, 4, 4, 4], [0] * 4)[:, :2],
     r"shape \(3, 2\); it must be \(rows, n\) on HBM with rows 3 or 4 \(has_rdispls=False\) "
     r"and n = 4 \(the rank-list size\)"),
    (cc.all_gather_v, np.zeros((5, 4), np.uint32), r"shape \(5, 4\)"),
    (cc.all_gather_v, np.zeros((2, 4), np.uint32), r"shape \(2, 4\)"),
    (cc.all_gather_v, _meta([4, 4, 4, 4], [0] * 4).astype(np.int32), "must be uint32, got int32"),
    (cc.all_to_all_v, _meta([0, 0, 0, 5], [0] * 4),
     r"rank 3 sends 5 elements, which do not fit at its slot \[0, 4\) of dsts\[0\] "
     r"\(16 elements\)"),
    (cc.all_gather_v, _meta([4] * 4, [0] * 4, [0, 3, 8, 12]),
     r"the chunks of ranks 3 and 1 overlap in dsts\[0\]"),
    (cc.all_gather_v, _meta([4] * 4, [0] * 4, [0, 4, 8, 13]),
     r"rank 2 sends 4 elements, which do not fit at recv_displs\[3\] = 13"),
])
def test_run_time_sizes_that_do_not_fit_are_refused(collective, meta, match):
    has_rdispls = meta.shape[0] == 4 and meta.dtype == np.uint32 and meta[3].any()
    k = _v_kernel(collective, has_rdispls=has_rdispls)
    with pytest.raises(ValidationError, match=match) as err:
        simulate(k, ranks=RANKS)(_srcs()[0], np.zeros(16, np.float32), meta)
    assert err.value.op == collective.__name__
    assert err.value.operand in ("metadata_tensor", "dsts[0]")


def test_dst_that_cannot_be_cut_into_equal_slots_is_refused():
    k = _v_kernel(cc.all_gather_v)
    with pytest.raises(ValidationError, match=r"dsts\[0\] has 10 elements, not a multiple of the "
                                              r"rank-list size 4") as err:
        simulate(k, ranks=RANKS)(_srcs()[0], np.zeros(10, np.float32), _meta([1] * 4, [0] * 4))
    assert err.value.operand == "dsts[0]"


def test_metadata_in_sbuf_must_be_one_partition():
    @jit
    def k(src, dst, meta):
        m = nl.ndarray((2, 3, RANKS), nl.uint32, buffer=nl.sbuf)
        nisa.dma_copy(dst=m, src=meta)
        cc.all_gather_v(srcs=[src], dsts=[dst], replica_group=[ORDER], metadata_tensor=m)
        return dst
    with pytest.raises(ValidationError, match=r"\(1, rows, n\) in SBUF"):
        simulate(k, ranks=RANKS)(_srcs()[0], np.zeros(8, np.float32),
                                 np.zeros((2, 3, RANKS), np.uint32))


def test_metadata_without_recv_displs_is_refused_when_they_are_promised():
    with pytest.raises(ValidationError, match=r"rows 4 \(has_rdispls=True\)"):
        simulate(_v_kernel(cc.all_gather_v, has_rdispls=True), ranks=RANKS)(
            _srcs()[0], np.zeros(16, np.float32), _meta([1] * 4, [0] * 4))


def test_metadata_in_sbuf_is_one_partition():
    @jit
    def k(src, dst, meta):
        m = nl.ndarray((1, 3, RANKS), nl.uint32, buffer=nl.sbuf)
        nisa.dma_copy(dst=m, src=meta.reshape((1, 3, RANKS)))
        cc.all_gather_v(srcs=[src], dsts=[dst], replica_group=[ORDER], metadata_tensor=m)
        out = nl.ndarray((1, 3, RANKS), nl.uint32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=m)
        return dst, out
    srcs = _srcs()
    got = simulate(k, ranks=RANKS)(per_rank(srcs), np.zeros(8, np.float32),
                                   _meta([2] * 4, [0] * 4))
    want = np.concatenate([srcs[s][:2] for s in ORDER])
    for dst, meta in got:
        np.testing.assert_array_equal(dst, want)
        np.testing.assert_array_equal(meta[0, 2], [2] * 4)


def test_ring_permute_sends_to_the_successor_on_every_channel():
    @jit
    def k(a, b, da, db):
        cc.collective_permute_implicit(srcs_by_channel=[[a], [b]], dsts_by_channel=[[da], [db]],
                                       replica_group=cc.ReplicaGroup([ORDER]), channel_ids=[0, 1])
        return da, db
    xs = [np.full((2, 3), r, np.float32) for r in range(RANKS)]
    ys = [np.full((4,), 10 * r, np.int32) for r in range(RANKS)]
    got = simulate(k, ranks=RANKS)(per_rank(xs), per_rank(ys), np.zeros((2, 3), np.float32),
                                   np.zeros(4, np.int32))
    for r in range(RANKS):
        pred = ORDER[(ORDER.index(r) - 1) % RANKS]
        np.testing.assert_array_equal(got[r][0], xs[pred])
        np.testing.assert_array_equal(got[r][1], ys[pred])


def test_ring_permute_reduce_sends_the_reduction():
    @jit
    def k(a, b, d):
        cc.collective_permute_implicit_reduce(srcs0_by_channel=[[a]], srcs1_by_channel=[[b]],
                                              dsts_by_channel=[[d]], replica_group=[ORDER],
                                              op=nl.maximum)
        return d
    rng = np.random.default_rng(3)
    xs = [rng.standard_normal((3, 5)).astype(np.float32) for _ in range(RANKS)]
    ys = [rng.standard_normal((3, 5)).astype(np.float32) for _ in range(RANKS)]
    got = simulate(k, ranks=RANKS)(per_rank(xs), per_rank(ys), np.zeros((3, 5), np.float32))
    for r in range(RANKS):
        pred = ORDER[(ORDER.index(r) - 1) % RANKS]
        np.testing.assert_array_equal(got[r], np.maximum(xs[pred], ys[pred]))


def test_ring_all_gather_in_a_device_loop_places_chunks_by_processing_rank_id():
    """The documented use: each ring step, the rank whose data arrived is read from a register
    and turned into the output offset of a dynamic access pattern."""
    rows = 2

    @jit
    def k(x):
        group = cc.ReplicaGroup([ORDER])
        out = nl.ndarray((RANKS * rows, 5), nl.float32, buffer=nl.shared_hbm)
        out_rows = out.reshape((RANKS, rows * 5))
        held = [nl.ndarray((rows, 5), nl.float32, buffer=nl.shared_hbm) for _ in range(2)]
        nisa.dma_copy(dst=held[0], src=x)
        for step in range(RANKS):                        # unrolled: buffers alternate
            who = cc.collective_permute_implicit_current_processing_rank_id(step, group)
            # rank ``who``'s chunk goes to rows who * rows ..: one row of out_rows per rank
            nisa.dma_copy(dst=out_rows.ap([[5, rows], [1, 5]], scalar_offset=who,
                                          indirect_dim=0),
                          src=held[step % 2])
            if step < RANKS - 1:
                cc.collective_permute_implicit(srcs_by_channel=[[held[step % 2]]],
                                               dsts_by_channel=[[held[(step + 1) % 2]]],
                                               replica_group=group)
        return out
    xs = [(np.full((rows, 5), r) + np.arange(5)).astype(np.float32) for r in range(RANKS)]
    got = simulate(k, ranks=RANKS)(per_rank(xs))
    for g in got:
        np.testing.assert_array_equal(g, np.concatenate(xs))


def test_processing_rank_id_follows_the_ring_backwards():
    seen = {}

    @jit
    def k(x):
        r = cc.rank_id()
        seen[r] = [cc.collective_permute_implicit_current_processing_rank_id(
            i, [ORDER]).read_value() for i in range(6)]
        return x
    simulate(k, ranks=RANKS)(np.zeros(1, np.float32))
    for r in range(RANKS):
        k0 = ORDER.index(r)
        assert seen[r] == [ORDER[(k0 - i) % RANKS] for i in range(6)]


@pytest.mark.parametrize("srcs, dsts, channel_ids, match, operand", [
    (1, 1, [1], r"channel_ids=\[1\] must be 0, 1, \.\., one per channel \(1\), at most 4",
     "channel_ids"),
    (1, 1, [0, 1], r"one per channel \(1\)", "channel_ids"),
    (5, 5, [0, 1, 2, 3, 4], r"at most 4", "channel_ids"),
    (2, 1, [0, 1], r"srcs_by_channel, dsts_by_channel must list the same, non-zero number of "
                   r"channels, got \[2, 1\]", "dsts_by_channel"),
])
def test_ring_channel_lists_and_ids_are_checked(srcs, dsts, channel_ids, match, operand):
    @jit
    def k(a, d):
        cc.collective_permute_implicit(srcs_by_channel=[[a]] * srcs, dsts_by_channel=[[d]] * dsts,
                                       replica_group=[[0, 1]], channel_ids=channel_ids)
        return d
    with pytest.raises(ValidationError, match=match) as err:
        simulate(k, ranks=2)(np.zeros(4, np.float32), np.zeros(4, np.float32))
    assert (err.value.op, err.value.operand) == ("collective_permute_implicit", operand)


def test_ring_inner_lists_hold_one_tensor_and_shapes_match():
    @jit
    def two(a, d):
        cc.collective_permute_implicit(srcs_by_channel=[[a, a]], dsts_by_channel=[[d, d]],
                                       replica_group=[[0, 1]])
        return d
    with pytest.raises(ValidationError, match=r"srcs_by_channel\[0\] must hold exactly one "
                                              r"tensor .*got 2") as err:
        simulate(two, ranks=2)(np.zeros(4, np.float32), np.zeros(4, np.float32))
    assert err.value.operand == "srcs_by_channel[0]"

    def reduce_kernel(op):
        @jit
        def k(a, b, d):
            cc.collective_permute_implicit_reduce(srcs0_by_channel=[[a]], srcs1_by_channel=[[b]],
                                                  dsts_by_channel=[[d]], replica_group=[[0, 1]],
                                                  op=op)
            return d
        return simulate(k, ranks=2)

    with pytest.raises(ValidationError, match=r"srcs1_by_channel\[0\]\[0\] has shape \(5,\), "
                                              r"expected \(4,\)"):
        reduce_kernel(nl.add)(np.zeros(4, np.float32), np.zeros(5, np.float32),
                              np.zeros(4, np.float32))
    with pytest.raises(ValidationError, match=r"op=.* must be nl.add, nl.minimum or nl.maximum"):
        reduce_kernel(nl.multiply)(*(np.zeros(4, np.float32),) * 3)


@pytest.mark.parametrize("iteration, channel, match, operand", [
    (-1, 0, r"iteration_id=-1 must be >= 0", "iteration_id"),
    (1.5, 0, r"iteration_id must be an int, a register or a scalar, got float", "iteration_id"),
    (True, 0, r"got bool", "iteration_id"),
    (0, 4, r"channel_id=4 must be in \[0, 4\)", "channel_id"),
])
def test_processing_rank_id_arguments_are_checked(iteration, channel, match, operand):
    @jit
    def k(x):
        cc.collective_permute_implicit_current_processing_rank_id(iteration, [[0, 1]],
                                                                  channel_id=channel)
        return x
    with pytest.raises(ValidationError, match=match) as err:
        simulate(k, ranks=2)(np.zeros(1, np.float32))
    assert err.value.operand == operand


def test_four_ring_channels_are_the_documented_maximum():
    @jit
    def k(a, d):
        cc.collective_permute_implicit(srcs_by_channel=[[a]] * 4, dsts_by_channel=[[d]] * 4,
                                       replica_group=[[0, 1]], channel_ids=[0, 1, 2, 3])
        return d
    xs = [np.full(4, r, np.float32) for r in range(2)]
    got = simulate(k, ranks=2)(per_rank(xs), np.zeros(4, np.float32))
    np.testing.assert_array_equal(got[0], xs[1])
    np.testing.assert_array_equal(got[1], xs[0])


def test_v_collectives_take_hbm_tensors_only():
    @jit
    def k(src, dst, meta):
        t = nl.ndarray((1, 6), nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=src.reshape((1, 6)))
        u = nl.ndarray((1, 8), nl.float32, buffer=nl.sbuf)
        cc.all_gather_v(srcs=[t], dsts=[u], replica_group=[ORDER], metadata_tensor=meta)
        return dst
    with pytest.raises(ValidationError, match=r"all_gather_v\(srcs\): tensors must be on HBM"):
        simulate(k, ranks=RANKS)(_srcs()[0], np.zeros(8, np.float32), _meta([2] * 4, [0] * 4))


def test_ring_ranks_passing_different_shapes_is_an_error():
    @jit
    def k(a, d):
        cc.collective_permute_implicit(srcs_by_channel=[[a]], dsts_by_channel=[[d]],
                                       replica_group=[[0, 1]])
        return d
    with pytest.raises(SynchronizationError, match="same group, shapes and dtypes"):
        simulate(k, ranks=2)(per_rank([np.zeros(4, np.float32), np.zeros(5, np.float32)]),
                             per_rank([np.zeros(4, np.float32), np.zeros(5, np.float32)]))


def test_processing_rank_id_of_a_device_loop_index():
    seen = {}

    @jit
    def k(x):
        r = cc.rank_id()

        def body(i):
            seen.setdefault(r, []).append(
                cc.collective_permute_implicit_current_processing_rank_id(i, [ORDER]).read_value())
        nl.fori_loop(0, 3, body)
        return x
    simulate(k, ranks=RANKS)(np.zeros(1, np.float32))
    for r in range(RANKS):
        k0 = ORDER.index(r)
        assert seen[r] == [ORDER[(k0 - i) % RANKS] for i in range(3)]


def test_all_to_all_v_with_recv_displs_packs_what_each_rank_receives():
    srcs = [np.arange(12, dtype=np.int32) + 100 * r for r in range(RANKS)]
    counts = {r: [(j + r) % 3 + 1 for j in range(RANKS)] for r in range(RANKS)}
    metas = []
    for r in range(RANKS):
        me = ORDER.index(r)
        got_counts = [counts[s][me] for s in ORDER]
        displs = list(np.cumsum([0] + got_counts)[:-1])
        metas.append(_meta(counts[r], [3 * j for j in range(RANKS)], displs))
    got = simulate(_v_kernel(cc.all_to_all_v, has_rdispls=True), ranks=RANKS)(
        per_rank(srcs), per_rank([np.full(12, -5, np.int32) for _ in range(RANKS)]),
        per_rank(metas))
    for r in range(RANKS):
        me = ORDER.index(r)
        packed = np.concatenate([srcs[s][3 * me:3 * me + counts[s][me]] for s in ORDER])
        want = np.full(12, -5, np.int32)
        want[:packed.size] = packed
        np.testing.assert_array_equal(got[r][0], want)


def test_v_collectives_take_one_tensor_per_list():
    @jit
    def k(src, dst, meta):
        cc.all_to_all_v(srcs=[src, src], dsts=[dst, dst], replica_group=[ORDER],
                        metadata_tensor=meta)
        return dst
    with pytest.raises(ValidationError, match=r"all_to_all_v\(srcs\): exactly one tensor"):
        simulate(k, ranks=RANKS)(_srcs()[0], np.zeros(8, np.float32), _meta([2] * 4, [0] * 4))


def test_v_collectives_treat_2d_tensors_as_flat_buffers():
    srcs = [np.arange(12, dtype=np.float32).reshape(3, 4) + 100 * r for r in range(RANKS)]
    dsts = [np.zeros((4, 6), np.float32) for _ in range(RANKS)]         # 24 = 4 slots of 6
    metas = [_meta([5] * 4, [2] * 4) for _ in range(RANKS)]             # elements 2..6 of each
    got = simulate(_v_kernel(cc.all_gather_v), ranks=RANKS)(per_rank(srcs), per_rank(dsts),
                                                           per_rank(metas))
    want = np.zeros(24, np.float32)
    for j, s in enumerate(ORDER):
        want[6 * j:6 * j + 5] = srcs[s].reshape(-1)[2:7]
    for dst, _ in got:
        np.testing.assert_array_equal(dst, want.reshape(4, 6))
