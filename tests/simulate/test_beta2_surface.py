"""The Beta 2 surface real kernels import: nki.isa.constants, enum values, NKIObject helper classes,
scalars and registers, device loops, shared constants, and the scan / top-8 / shuffle / nonzero
instructions, each against NumPy."""

import dataclasses
import sys

import numpy as np
import pytest

from nki_kernels import simulate
from nki_kernels.simulate import jit, nisa, nl

from .isa_util import run, sb


def test_isa_constants_module_and_documented_enum_values():
    with simulate.patched():
        from nki.isa.constants import dge_mode, oob_mode, reduce_cmd
        import nki
        import nki.isa
        assert nki.isa.constants.dge_mode is dge_mode
        assert isinstance(nki.dtype, type) and nki.language.bool is nki.language.bool_
    assert dge_mode(3) is dge_mode.none and dge_mode(1) is dge_mode.swdge
    assert oob_mode(1) is oob_mode.skip
    assert reduce_cmd(3) is reduce_cmd.reset_reduce and reduce_cmd(4) is reduce_cmd.load_reduce
    assert "nki" not in sys.modules or not getattr(sys.modules["nki"], "__nki_kernels_simulator__",
                                                   False)


def test_nkiobject_dataclass_with_plain_attributes():
    @dataclasses.dataclass
    class Tiles(nl.NKIObject):
        rows: int = 128
        cols = 512                       # plain attribute, passed as a keyword by real kernels

        def size(self):
            return self.rows * self.cols

    assert Tiles(rows=64, cols=3).size() == 192 and Tiles().size() == 128 * 512

    class Plain(nl.NKIObject):
        depth = 2
    assert Plain(depth=5).depth == 5 and Plain().depth == 2


def test_scalar_load_arithmetic_and_store():
    @jit
    def k(index):
        t = nl.ndarray((1, 1), nl.int32, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=index)
        i = nisa.scalar_load(t) * 4 + 1
        out_sb = nl.ndarray((1, 1), nl.int32, buffer=nl.sbuf)
        nisa.scalar_store(out_sb, i)
        out = nl.ndarray((1, 1), nl.int32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=out_sb)
        return out
    assert k(np.array([[5]], np.int32))[0, 0] == 21
    big = k(np.array([[2**30]], np.int32))[0, 0]
    assert big == np.int32(np.int64(2**32 + 1).astype(np.int32))       # 32-bit wrap


def _register_from(x):
    """A register holding the (1, 1) int32 HBM tensor ``x`` (inside a kernel)."""
    t = nl.ndarray((1, 1), nl.int32, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    r = nisa.register_alloc()
    nisa.register_load(r, t)
    return r


def test_registers_refuse_python_control_flow():
    @jit
    def k(x):
        r = _register_from(x)
        if r:                                            # the tracer cannot know this
            pass
    with pytest.raises(TypeError, match="cannot drive Python control flow"):
        k(np.array([[1]], np.int32))


def test_fori_loop_with_register_bound_runs_and_is_counted():
    @jit
    def k(data, n):
        reg = _register_from(n)
        out = nl.ndarray(data.shape, data.dtype, buffer=nl.shared_hbm)
        zero = nl.zeros(data.shape, data.dtype)
        nisa.dma_copy(dst=out, src=zero)
        tmp = nl.ndarray((1, 1), data.dtype, buffer=nl.sbuf)

        def body(i):
            nisa.dma_copy(dst=tmp, src=data.ap([[1, 1], [1, 1]], scalar_offset=i, indirect_dim=1))
            nisa.tensor_scalar(dst=tmp, data=tmp, op0=nl.multiply, operand0=2.0)
            nisa.dma_copy(dst=out.ap([[1, 1], [1, 1]], scalar_offset=i, indirect_dim=1), src=tmp)
        nl.fori_loop(0, reg, body)
        return out
    x = np.arange(1, 9, dtype=np.float32).reshape(1, 8)
    out = k(x, np.array([[5]], np.int32))
    np.testing.assert_array_equal(out, np.where(np.arange(8) < 5, 2 * x, 0))
    assert simulate.last_trace().loops[-1]["iterations"] == 5
    assert simulate.last_trace().count_by_op()["dma_copy"] == 2 + 2 * 5


def test_shared_identity_and_constant():
    @jit
    def k(x):
        eye = nl.shared_identity_matrix(4, dtype=nl.float32)
        c = nl.shared_constant(np.full((4, 4), 3, np.float32))
        t = nl.ndarray((4, 4), nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=c)
        nisa.tensor_tensor(dst=t, data1=t, data2=eye, op=nl.add)
        out = nl.ndarray((4, 4), nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=t)
        return out
    np.testing.assert_array_equal(k(np.zeros(1, np.float32)), 3 + np.eye(4))


def test_tensor_tensor_scan_matches_its_recurrence(rng):
    a, b = rng.standard_normal((5, 9)).astype(np.float32), rng.standard_normal((5, 9)).astype(np.float32)

    def body(x, y):
        t = sb((5, 9))
        nisa.tensor_tensor_scan(dst=t, data0=x, data1=y, initial=0.5, op0=nl.multiply, op1=nl.add)
        return t
    want, prev = np.empty_like(a), np.full(5, 0.5, np.float32)
    for i in range(9):
        prev = a[:, i] * prev + b[:, i]
        want[:, i] = prev
    np.testing.assert_allclose(run(body, a, b), want, rtol=1e-6)


def test_tensor_scalar_cumulative_running_max(rng):
    a = rng.standard_normal((3, 10)).astype(np.float32)

    def body(x):
        t = sb((3, 10))
        nisa.tensor_scalar_cumulative(dst=t, src=x, op0=nl.add, op1=nl.maximum, imm0=1.0)
        return t
    np.testing.assert_allclose(run(body, a), np.maximum.accumulate(a + 1, axis=1))


def test_find_index8_and_match_replace8():
    data = np.array([[1, 2, 3, 4, 8, 8, 8, 8, 8, 8, 8]], np.float32)
    vals = np.array([[3, 8, 8, 8, 8, 8, 8, 8]], np.float32)

    def find(x, v):
        t = sb((1, 8), nl.uint32)
        nisa.nc_find_index8(dst=t, data=x, vals=v)
        return t
    np.testing.assert_array_equal(run(find, data, vals), [[2, 4, 5, 6, 7, 8, 9, 10]])

    def match(x, v):
        t, idx = sb((1, 11)), sb((1, 8), nl.uint32)
        nisa.nc_match_replace8(dst=t, data=x, vals=v, imm=-1.0, dst_idx=idx)
        return t, idx
    out, idx = run(match, data, vals)
    np.testing.assert_array_equal(idx, [[2, 10, 9, 8, 7, 6, 5, 4]])      # documented tie-break
    np.testing.assert_array_equal(out, [[1, 2, -1, 4, -1, -1, -1, -1, -1, -1, -1]])
    missing = np.array([[9, 8, 8, 8, 8, 8, 8, 8]], np.float32)
    assert run(find, data, missing)[0, 0] == 0xFFFFFFFF


def test_stream_shuffle_per_quadrant(rng):
    a = rng.standard_normal((64, 3)).astype(np.float32)
    mask = [31 - i for i in range(32)]
    mask[5] = 255

    def body(x):
        t = sb((64, 3))
        nisa.memset(dst=t, value=7.0)
        nisa.nc_stream_shuffle(dst=t, src=x, shuffle_mask=mask)
        return t
    out = run(body, a)
    for p in range(64):
        want = 7.0 if p % 32 == 5 else a[(p // 32) * 32 + 31 - p % 32]
        np.testing.assert_array_equal(out[p], want)


def test_nonzero_with_count_reads_core_partitions_only():
    x = np.zeros((32, 8), np.float32)
    x[0, [1, 2, 5]] = 1
    x[16, [0]] = 3
    x[3, :] = 1                                  # not a GpSimd core's partition: ignored

    def body(t):
        d = sb((32, 9), nl.int32)
        nisa.memset(dst=d, value=99)
        nisa.nonzero_with_count(dst=d, src=t, index_offset=16, padding_val=-1)
        return d
    out = run(body, x)
    np.testing.assert_array_equal(out[0], [17, 18, 21, -1, -1, -1, -1, -1, 3])
    np.testing.assert_array_equal(out[16], [16, -1, -1, -1, -1, -1, -1, -1, 1])
    assert (out[3] == 99).all()
    with pytest.raises(simulate.TargetError, match="NeuronCore-v3"):
        run(body, x, target="trn1")


def test_while_on_a_register_is_a_device_loop_but_if_is_refused():
    @jit
    def k(x):
        out = nl.ndarray((1, 1), nl.int32, buffer=nl.shared_hbm)
        left = nl.ndarray((1, 1), nl.int32, buffer=nl.sbuf)
        nisa.dma_copy(dst=left, src=x)
        total = nl.ndarray((1, 1), nl.int32, buffer=nl.sbuf)
        nisa.memset(dst=total, value=0)
        reg = nisa.register_alloc()
        nisa.register_load(reg, left)
        while reg:
            nisa.tensor_scalar(dst=total, data=total, op0=nl.add, operand0=10)
            nisa.tensor_scalar(dst=left, data=left, op0=nl.subtract, operand0=1)
            nisa.register_load(reg, left)
        nisa.dma_copy(dst=out, src=total)
        return out
    assert k(np.array([[3]], np.int32))[0, 0] == 30
    assert k(np.array([[0]], np.int32))[0, 0] == 0


def test_fori_loop_index_is_a_scalar_with_int_bounds_and_a_register_with_register_bounds():
    seen = []

    @jit
    def k(n):
        reg = _register_from(n)
        nl.fori_loop(0, 2, lambda i: seen.append(type(i).__name__))
        nl.fori_loop(0, reg, lambda i: seen.append(type(i).__name__))
    k(np.array([[1]], np.int32))
    assert seen == ["NkiScalar", "NkiScalar", "VirtualRegister"]


def test_program_size_counts_one_copy_of_each_loop_body():
    @jit
    def k(n):
        trips = _register_from(n)
        acc = nl.ndarray((1, 1), nl.int32, buffer=nl.sbuf)
        nisa.memset(dst=acc, value=0)

        def outer(i):
            def inner(j):
                nisa.tensor_scalar(dst=acc, data=acc, op0=nl.add, operand0=1)
            nl.fori_loop(0, 3, inner)
            nisa.tensor_scalar(dst=acc, data=acc, op0=nl.multiply, operand0=1)
        nl.fori_loop(0, trips, outer)
    k(np.array([[4]], np.int32))
    trace = simulate.last_trace()
    assert len(trace) == 2 + 4 * (3 + 1)
    assert trace.program_instructions == 2 + 1 + 1
    assert [(l["iterations"], l["depth"]) for l in trace.loops][-2:] == [(3, 1), (4, 0)]


def _differences_kernel(carry_in_place):
    @jit
    def k(x):
        n = x.shape[1]
        out = nl.ndarray((1, n), nl.float32, buffer=nl.shared_hbm)
        prev = [nl.ndarray((1, 1), nl.float32, buffer=nl.sbuf, name="prev")]
        nisa.memset(dst=prev[0], value=0.0)

        def body(i):
            cur = nl.ndarray((1, 1), nl.float32, buffer=nl.sbuf, name="cur")
            nisa.dma_copy(dst=cur, src=x.ap([[n, 1], [1, 1]], scalar_offset=i, indirect_dim=1))
            d = nl.ndarray((1, 1), nl.float32, buffer=nl.sbuf, name="d")
            nisa.tensor_tensor(dst=d, data1=cur, data2=prev[0], op=nl.subtract)
            nisa.dma_copy(dst=out.ap([[n, 1], [1, 1]], scalar_offset=i, indirect_dim=1), src=d)
            if carry_in_place:
                nisa.tensor_copy(dst=prev[0], src=cur)
            else:
                prev[0] = cur          # a body tile: the next iteration's "cur" is this buffer
        nl.fori_loop(0, n, body)
        return out
    return k


def test_loop_body_allocations_are_reused_across_iterations_as_on_device():
    x = np.array([[1.0, 4.0, 9.0, 16.0]], np.float32)
    np.testing.assert_array_equal(_differences_kernel(True)(x), [[1, 3, 5, 7]])
    # Keeping a body tile for the next iteration reads the same buffer the next iteration
    # overwrites: on device (and here) every later difference is 0.
    np.testing.assert_array_equal(_differences_kernel(False)(x), [[1, 0, 0, 0]])


def test_kernel_inputs_arrive_in_hbm_or_shared_hbm_under_lnc2():
    """The NKI simulator guide ("How It Works"): array arguments are NkiTensors with
    buffer=nl.hbm, or shared_hbm for LNC2 kernels."""
    from nki_kernels.simulate import jit, nl
    seen = []

    @jit
    def k(a):
        seen.append((a.buffer == nl.hbm, a.buffer == nl.shared_hbm))
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        return out

    x = np.zeros((2, 2), np.float32)
    k(x)
    k[2](x)
    assert seen == [(True, False), (False, True), (False, True)]


def test_with_schedule_adds_named_edges_and_refuses_unknown_names():
    """The scheduling guide's first example: "plus1" depends on "recip" (a name or a list)."""
    from nki_kernels import simulate
    from nki_kernels.simulate import jit, nisa, nl

    @jit
    def kernel(t):
        x = nl.ndarray(t.shape, t.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=x, src=t)
        a = nl.ndarray(t.shape, t.dtype, buffer=nl.sbuf)
        b = nl.ndarray(t.shape, t.dtype, buffer=nl.sbuf)
        c = nl.ndarray(t.shape, t.dtype, buffer=nl.sbuf)
        nisa.reciprocal(dst=a, data=x, name="recip")
        nisa.tensor_scalar(dst=b, data=x, op0=nl.add, operand0=1, name="plus1")
        nisa.tensor_tensor(dst=c, data1=a, data2=b, op=nl.add)
        out = nl.ndarray(t.shape, t.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=c)
        return out

    t = np.full((4, 4), 2.0, np.float32)
    for edges in ([("plus1", "recip")], [("plus1", ["recip"])]):
        out = kernel.with_schedule(edges)(t)
        np.testing.assert_allclose(out, 3.5)
        trace = simulate.last_trace()
        recip = next(e for e in trace if e.name == "recip")
        plus1 = next(e for e in trace if e.name == "plus1")
        assert plus1.details["after"] == [(recip.index, "schedule")]
    with pytest.raises(simulate.ValidationError, match="no instruction is named 'plus2'"):
        kernel.with_schedule([("plus2", "recip")])(t)
    with pytest.raises(simulate.UnsupportedError, match="'recip' is issued before 'plus1'"):
        kernel.with_schedule([("recip", "plus1")])(t)
    with pytest.raises(ValueError, match="must be a pair"):
        kernel.with_schedule(["recip"])


def test_an_error_inside_an_instruction_leaves_as_a_simulation_error(monkeypatch):
    """Whatever fails inside an instruction reaches the caller as a SimulationError naming the
    instruction, the program and the kernel line (InternalError, the original as its cause)."""
    import re

    from nki_kernels import simulate
    from nki_kernels.simulate import jit, nisa, nl
    from nki_kernels.simulate.errors import InternalError
    from nki_kernels.simulate.isa import dma

    def broken(*args):
        raise ValueError("boom")
    monkeypatch.setattr(dma, "_runs", broken)

    @jit
    def k(x):
        t = nl.ndarray(x.shape, x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x)
        return x

    with pytest.raises(InternalError) as info:
        k(np.zeros((2, 2), np.float32))
    assert isinstance(info.value, simulate.SimulationError)
    assert isinstance(info.value.__cause__, ValueError)
    assert re.fullmatch(r"dma_copy: ValueError: boom \(a case the simulator does not check; please "
                        r"report it\) \(program_id=\(0,\), test_beta2_surface.py:\d+\)",
                        str(info.value))
