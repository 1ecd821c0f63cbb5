"""The torch block-table entries against the NumPy ones: the same cache bytes (written into the
caller's tensors in place), the same outputs, for a (2, N, ...) cache and a (k, v) pair, decode
and ragged prefill with the fused write; refusals before any write."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from nki_kernels import block_tables as np_entries  # noqa: E402
from nki_kernels.torch import block_tables as torch_entries  # noqa: E402
from nki_kernels.torch.convert import to_numpy, to_torch  # noqa: E402

N, H, D, P = 24, 2, 16, 4


def _case(rng, layout):
    seq_lens = np.array([9, 0, 14, 5], np.int32)
    q_lens = np.array([3, 0, 4, 1], np.int32)
    tables = np.full((4, 5), -1, np.int32)
    pages = rng.permutation(N).astype(np.int32)
    need = -(-seq_lens // P)
    for b, start in enumerate(np.concatenate([[0], np.cumsum(need)])[:-1]):
        tables[b, :need[b]] = pages[start:start + need[b]]
    qsl = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    shape = (2, N, H, P, D) if layout == "HND" else (2, N, P, H, D)
    cache = rng.standard_normal(shape).astype(np.float32)
    rows = lambda: rng.standard_normal((int(qsl[-1]), H, D)).astype(np.float32)  # noqa: E731
    return tables, seq_lens, qsl, cache, rows(), rows(), rng.standard_normal(
        (int(qsl[-1]), 2 * H, D)).astype(np.float32)


def _with_expected(rng, layout, pair):
    """A case, the cache the NumPy append leaves, and a torch copy of the cache (the tensor, and
    the argument: the tensor or its (k, v) halves)."""
    tables, seq_lens, qsl, cache, key, value, q = _case(rng, layout)
    want = cache.copy()
    np_entries.append_kv_with_block_tables(key, value, want, tables, seq_lens, qsl, layout)
    t_cache = torch.from_numpy(cache.copy())
    arg = (t_cache[0], t_cache[1]) if pair else t_cache
    return tables, seq_lens, qsl, cache, key, value, q, want, t_cache, arg


@pytest.mark.parametrize("layout", ["HND", "NHD"])
@pytest.mark.parametrize("pair", [False, True])
def test_torch_entries_equal_the_numpy_ones(rng, target, layout, pair):
    tables, seq_lens, qsl, cache, key, value, q, want, t_cache, arg = _with_expected(rng, layout,
                                                                                     pair)
    T = torch.from_numpy
    torch_entries.append_kv_with_block_tables(T(key), T(value), arg, T(tables), T(seq_lens),
                                              T(qsl), layout)
    assert to_numpy(t_cache).tobytes() == want.tobytes()          # written in place
    out, lse = torch_entries.attention_with_block_tables(T(q), arg, T(tables), T(seq_lens),
                                                         T(qsl), layout, return_lse=True)
    ref, ref_lse = np_entries.attention_with_block_tables(q, want, tables, seq_lens, qsl, layout,
                                                          return_lse=True)
    assert isinstance(out, torch.Tensor) and np.array_equal(out.numpy(), ref)
    assert np.array_equal(lse.numpy(), ref_lse)
    rows, last = [0, 2, 3], q[qsl[1:] - 1][[0, 2, 3]]           # decode: one query each
    dec = torch_entries.attention_with_block_tables(T(last), arg, T(tables[rows]),
                                                    T(seq_lens[rows]), None, layout)
    want_dec = np_entries.attention_with_block_tables(last, want, tables[rows], seq_lens[rows],
                                                      None, layout)
    np.testing.assert_array_equal(dec.numpy(), want_dec)
    np.testing.assert_allclose(dec.numpy(), ref[qsl[1:] - 1][rows], atol=2e-5)


def test_fused_write_through_the_torch_entry(rng, target):
    tables, seq_lens, qsl, cache, key, value, q = _case(rng, "HND")
    want = cache.copy()
    ref = np_entries.attention_with_block_tables(q, want, tables, seq_lens, qsl, "HND",
                                                 append_key=key, append_value=value)
    t_cache = torch.from_numpy(cache.copy())
    out = torch_entries.attention_with_block_tables(
        torch.from_numpy(q), t_cache, torch.from_numpy(tables), torch.from_numpy(seq_lens),
        torch.from_numpy(qsl), "HND", append_key=to_torch(key), append_value=to_torch(value))
    assert to_numpy(t_cache).tobytes() == want.tobytes()
    np.testing.assert_array_equal(out.numpy(), ref)


def test_refusals_before_any_write(rng):
    tables, seq_lens, qsl, cache, key, value, _ = _case(rng, "HND")
    T = torch.from_numpy
    grad = T(cache.copy()).requires_grad_(True)
    with pytest.raises(RuntimeError, match="kv_cache requires grad"):
        torch_entries.append_kv_with_block_tables(T(key), T(value), grad, T(tables), T(seq_lens),
                                                  T(qsl))
    t_cache = T(cache.copy())
    with pytest.raises(RuntimeError, match="seq_lens is on meta but the cache is on cpu"):
        torch_entries.append_kv_with_block_tables(T(key), T(value), t_cache, T(tables),
                                                  T(seq_lens).to("meta"), T(qsl))
    with pytest.raises(RuntimeError, match="torch-neuronx"):     # a device cache, no Neuron SDK
        torch_entries.append_kv_with_block_tables(T(key), T(value), t_cache.to("meta"),
                                                  T(tables), T(seq_lens), T(qsl))
    bad = tables.copy()
    bad[0, 0] = -1                                       # a page request 0 needs
    with pytest.raises(ValueError, match=r"block_tables\[0, 0\]"):
        torch_entries.append_kv_with_block_tables(T(key), T(value), t_cache, T(bad), T(seq_lens),
                                                  T(qsl))
    strided = T(cache.copy()).transpose(3, 4)
    with pytest.raises(ValueError, match="contiguous"):
        torch_entries.append_kv_with_block_tables(T(key), T(value), strided, T(tables),
                                                  T(seq_lens), T(qsl))
    assert to_numpy(t_cache).tobytes() == cache.tobytes()


@pytest.mark.parametrize("layout", ["HND", "NHD"])
@pytest.mark.parametrize("pair", [False, True])
def test_device_path_equals_the_numpy_entries(rng, target, layout, pair):
    """The Neuron-device path (tables through the host, kernels on the tensors; run here on CPU
    tensors by the simulator): the same cache bytes and outputs as the NumPy entries, for a
    (2, N, ...) cache and a pair, decode, ragged prefill and the fused write."""
    tables, seq_lens, qsl, cache, key, value, q, want, t_cache, arg = _with_expected(rng, layout,
                                                                                     pair)
    T = torch.from_numpy
    torch_entries.append_kv_device(T(key), T(value), arg, T(tables), T(seq_lens), T(qsl), layout)
    assert to_numpy(t_cache).tobytes() == want.tobytes()
    out, lse = torch_entries.attention_device(T(q), arg, T(tables), T(seq_lens), T(qsl), layout,
                                              return_lse=True)
    ref, ref_lse = np_entries.attention_with_block_tables(q, want, tables, seq_lens, qsl, layout,
                                                          return_lse=True)
    # one launch for the whole ragged batch here, two (blocks, then single queries) in the NumPy
    # entry: fp32 sums in another order
    np.testing.assert_allclose(out.numpy(), ref, atol=2e-5, rtol=2e-5)
    np.testing.assert_allclose(lse.numpy(), ref_lse, atol=2e-4, rtol=2e-5)
    rows, last = [0, 2, 3], q[qsl[1:] - 1][[0, 2, 3]]
    dec = torch_entries.attention_device(T(last), arg, T(tables[rows]), T(seq_lens[rows]), None,
                                         layout)
    np.testing.assert_array_equal(dec.numpy(), np_entries.attention_with_block_tables(
        last, want, tables[rows], seq_lens[rows], None, layout))
    fresh = torch.from_numpy(cache.copy())
    fused = torch_entries.attention_device(
        T(q), (fresh[0], fresh[1]) if pair else fresh, T(tables), T(seq_lens), T(qsl), layout,
        append_key=T(key), append_value=T(value))
    assert to_numpy(fresh).tobytes() == want.tobytes()               # the launch's own write
    np.testing.assert_allclose(fused.numpy(), ref, atol=2e-5, rtol=2e-5)


def test_device_path_refuses_before_writing(rng):
    tables, seq_lens, qsl, cache, key, value, _ = _case(rng, "HND")
    T = torch.from_numpy
    t_cache = T(cache.copy())
    bad = tables.copy()
    bad[2, 1] = -1
    with pytest.raises(ValueError, match=r"block_tables\[2, 1\]"):
        torch_entries.append_kv_device(T(key), T(value), t_cache, T(bad), T(seq_lens), T(qsl))
    with pytest.raises(ValueError, match="kv_cache shape"):
        torch_entries.append_kv_device(T(key), T(value), t_cache[0], T(tables), T(seq_lens),
                                       T(qsl))
    with pytest.raises(ValueError, match="query_start_loc"):
        torch_entries.append_kv_device(T(key), T(value), t_cache, T(tables), T(seq_lens),
                                       T(qsl[:-1]))
    with pytest.raises(NotImplementedError, match="k_scale per kv head"):
        torch_entries.append_kv_device(T(key), T(value), t_cache, T(tables), T(seq_lens),
                                       T(qsl), k_scale=torch.ones(H))
    assert to_numpy(t_cache).tobytes() == cache.tobytes()


def test_device_options_are_taken_or_refused_by_name():
    take = torch_entries._device_options
    assert take(dict(k_scale=0.5, lnc=1, spare_page=None), ("k_scale",)) == dict(k_scale=0.5)
    with pytest.raises(NotImplementedError, match="lnc, spare_page"):
        take(dict(lnc=2, spare_page=3), ("k_scale",))
