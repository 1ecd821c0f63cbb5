"""Simulator core: views, fresh-memory sentinels, capacity, launch grids, host conversion, registers."""

import numpy as np
import pytest

from nki_kernels import simulate
from nki_kernels.simulate import jit, nisa, nl

from .isa_util import write_then_read_all


def test_partition_dim_rules():
    s = nl.ndarray((8, 4, 6), nl.float32, buffer=nl.sbuf)
    assert s[3].shape == (1, 4, 6)                 # int on dim 0 keeps a size-1 partition dim
    assert s[:, 2].shape == (8, 6)                 # int on a free dim drops it
    assert s[:, 2, 5].shape == (8, 1)              # ... unless the tile would drop below 2-D
    h = nl.ndarray((8, 4, 6), nl.float32, buffer=nl.hbm)
    assert h[3].shape == (4, 6) and h[:, 2, 5].shape == (8,)
    assert s[:, nl.ds(1, 2), ::2].shape == (8, 2, 3)
    assert s.permute((0, 2, 1)).strides == (24, 1, 6)
    with pytest.raises(simulate.ValidationError, match="partition dim must stay first"):
        s.permute((1, 0, 2))
    assert s.view(nl.bfloat16).shape == (8, 4, 12)
    assert h.reshape((32, 6)).shape == (32, 6)
    with pytest.raises(simulate.OutOfBoundsError, match="out of range"):
        s[:, 4]


def test_fresh_memory_is_a_sentinel():
    f = nl.ndarray((2, 3), nl.bfloat16, buffer=nl.sbuf)
    i = nl.ndarray((2, 3), nl.int32, buffer=nl.sbuf)
    u = nl.ndarray((2, 3), nl.uint8, buffer=nl.sbuf)
    assert np.isnan(simulate.to_numpy(f).astype(np.float32)).all()
    assert (simulate.to_numpy(i) == np.iinfo(np.int32).min).all()
    assert (simulate.to_numpy(u) == 255).all()


@pytest.mark.parametrize("target, ok_tiles", [("trn1", 43), ("trn2", 51)])
def test_sbuf_capacity_per_target(target, ok_tiles):
    @jit
    def k(x, n):
        keep = [nl.ndarray((128, 1024), nl.float32, buffer=nl.sbuf) for _ in range(n)]   # 4 KiB each
        write_then_read_all(keep)
        return x
    x = np.zeros((1, 1), np.float32)
    # 43 tiles + the 4 B sink <= 180224 < 44 tiles + the sink (trn1); 51 + 4 <= 212984 (trn2)
    simulate.simulate(k, target=target)(x, ok_tiles)
    with pytest.raises(simulate.CapacityError, match=f"usable on {target}"):
        simulate.simulate(k, target=target)(x, ok_tiles + 1)


def test_tiles_count_from_first_to_last_use():
    """As the compiler allocates: a tile rebound, kept in a list or left bound to a name but
    never used again holds nothing after its last use; a tile never used holds nothing."""
    @jit
    def loop(x):
        for _ in range(200):
            t = nl.ndarray((128, 4096), nl.float32, buffer=nl.sbuf)   # 16 KiB, used once each
            nisa.memset(dst=t, value=1.0)
        dead = []
        for _ in range(40):                                        # 640 KiB kept in a list
            d = nl.ndarray((128, 4096), nl.float32, buffer=nl.sbuf)
            nisa.memset(dst=d, value=1.0)
            dead.append(d)
        unused = [nl.ndarray((128, 512), nl.float32, buffer=nl.psum) for _ in range(30)]
        banks = [nl.ndarray((128, 512), nl.float32, buffer=nl.psum) for _ in range(8)]
        write_then_read_all(banks)
        rotating, small = [], nl.ndarray((128, 1), nl.float32, buffer=nl.sbuf)
        for _ in range(24):                                        # 24 banks, 2 live at a time
            b = nl.ndarray((128, 512), nl.float32, buffer=nl.psum)
            nisa.memset(dst=b, value=0.0)
            rotating.append(b)
            if len(rotating) > 1:
                nisa.tensor_copy(dst=small, src=rotating[-2][:, 0:1])
        return x
    loop(np.zeros((1, 1), np.float32))
    peaks = simulate.last_trace().memory_peaks
    assert peaks["psum_banks"] == 8
    assert peaks["sbuf_bytes_per_partition"] == 16384               # one 16 KiB tile at a time

    @jit
    def nine(x):
        banks = [nl.ndarray((128, 100), nl.float32, buffer=nl.psum) for _ in range(9)]
        write_then_read_all(banks)
    with pytest.raises(simulate.CapacityError,
                       match=r"PSUM over capacity: a tile \(128, 100\) float32 \(1 bank\(s\) of "
                             r"2048 B\) is first used with 8 of 8 banks live .* \(program_id="
                             r"\(0,\), isa_util.py:\d+\)"):
        nine(np.zeros((1, 1), np.float32))


def test_lnc_grid_shares_shared_hbm_outputs():
    @jit
    def halves(x):
        n = x.shape[0] // nl.num_programs(0)
        r0 = nl.program_id(0) * n
        out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
        t = nl.ndarray((n, x.shape[1]), x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x[r0:r0 + n, :])
        nisa.tensor_scalar(dst=t, data=t, op0=nl.add, operand0=float(nl.program_id(0)))
        nisa.dma_copy(dst=out[r0:r0 + n, :], src=t)
        return out
    x = np.arange(12, dtype=np.float32).reshape(4, 3)
    want = x + np.array([[0], [0], [1], [1]])
    np.testing.assert_array_equal(halves[2](x), want)
    np.testing.assert_array_equal(simulate.simulate(halves[2], shuffle=True, seed=3)(x), want)
    assert {e.program_id for e in simulate.last_trace()} == {(0,), (1,)}


def test_inputs_written_in_place_and_64bit_refused():
    @jit
    def fill(x):
        t = nl.ndarray((2, 2), nl.float32, buffer=nl.sbuf)
        nisa.memset(dst=t, value=7.0)
        nisa.dma_copy(dst=x, src=t)
    a = np.zeros((2, 2), np.float32)
    fill(a)
    assert (a == 7).all()
    b = np.zeros((2, 4), np.float32)[:, ::2]              # non-contiguous: copied in and back
    fill(b)
    assert (b == 7).all()
    with pytest.raises(TypeError, match="int64 is not an NKI dtype"):
        fill(np.zeros((2, 2), np.int64))


def test_torch_tensors_in_and_out():
    torch = pytest.importorskip("torch")

    @jit
    def double(x):
        t = nl.load(x)
        out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
        nl.store(out, nl.multiply(t, 2.0))
        return out
    x = torch.arange(6, dtype=torch.bfloat16).reshape(2, 3)
    y = double(x)
    assert isinstance(y, torch.Tensor) and y.dtype == torch.bfloat16
    assert torch.equal(y, x * 2)


def test_registers_loops_and_scalar_offset():
    @jit
    def k(x):
        out = nl.ndarray((4, 3), x.dtype, buffer=nl.shared_hbm)
        idx = nl.ndarray((1, 1), nl.int32, buffer=nl.sbuf)

        def body(i):
            reg = nisa.register_alloc()
            nisa.register_move(reg, i)
            nisa.register_store(idx, reg)
            row = nl.ndarray((1, 3), x.dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=row, src=x.ap([[3, 1], [1, 3]], scalar_offset=reg, indirect_dim=0))
            nisa.dma_copy(dst=out.ap([[3, 1], [1, 3]], scalar_offset=idx), src=row)
        nl.fori_loop(0, 4, body)
        return out
    x = np.arange(12, dtype=np.float32).reshape(4, 3)
    np.testing.assert_array_equal(k(x), x)


def test_dma_rules():
    @jit
    def from_psum(x):
        p = nl.ndarray((2, 2), nl.float32, buffer=nl.psum)
        nisa.dma_copy(dst=x, src=p)
    with pytest.raises(simulate.ValidationError, match="PSUM cannot be a DMA source"):
        from_psum(np.zeros((2, 2), np.float32))

    @jit
    def hw(x):
        t = nl.ndarray((2, 2), nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x, dge_mode=nisa.dge_mode.hwdge)
    hw(np.zeros((2, 2), np.float32))
    with pytest.raises(simulate.TargetError, match="hwdge needs NeuronCore-v3"):
        simulate.simulate(hw, target="trn1")(np.zeros((2, 2), np.float32))

    @jit
    def mismatch(x):
        t = nl.ndarray((2, 3), nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x)
    with pytest.raises(simulate.ValidationError, match="element counts differ"):
        mismatch(np.zeros((2, 2), np.float32))


def test_an_input_returned_whole_is_the_callers_own_array():
    from nki_kernels.simulate import jit, nisa, nl

    @jit
    def bump(x):
        t = nl.ndarray(x.shape, x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x)
        nisa.tensor_scalar(dst=t, data=t, op0=nl.add, operand0=1.0)
        nisa.dma_copy(dst=x, src=t)
        return x, x[0:1, :]

    x = np.zeros((2, 3), np.float32)
    whole, part = bump(x)
    assert whole is x and (x == 1).all()
    assert part is not x and part.shape == (1, 3)            # a part is a copy


def test_unknown_jit_options_are_refused():
    from nki_kernels.simulate import jit
    import pytest

    def k(x):
        return x
    with pytest.raises(TypeError, match=r"unknown option\(s\) \['debug'\]"):
        jit(k, debug=True)
    with pytest.raises(ValueError, match="mode='fast'"):
        jit(mode="fast")(k)
    assert jit(mode="simulation")(k) is not None
    assert jit(mode="auto", debug_kernel=True, show_compiler_tb=True,      # as nki-library's qkv
               experimental_flags="skip-non-top-level-shared-hbm-check")(k) is not None


def test_host_code_sees_the_target_selected_now():
    """nisa.get_nc_version() outside a kernel follows use_target (host code decides the kernel's
    path with it); it kept the first target it was asked under."""
    from nki_kernels.simulate import nisa
    with simulate.use_target("trn1"):
        assert nisa.get_nc_version() == 2
    with simulate.use_target("trn2"):
        assert nisa.get_nc_version() == 3
        with simulate.use_target("trn1"):
            assert nisa.get_nc_version() == 2
        assert nisa.get_nc_version() == 3
