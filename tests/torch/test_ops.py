"""The custom ops on CPU tensors: simulator and reference backends, torch.compile, opcheck."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import nki_kernels.torch as nt  # noqa: E402
from nki_kernels.torch.convert import to_numpy  # noqa: E402

from ..kernels.paged_attention.conftest import make_decode_case  # noqa: E402
from ..kernels.paged_kv_append.conftest import make_append_case  # noqa: E402


def as_torch(args):
    return [torch.from_numpy(a) if isinstance(a, np.ndarray) else a for a in args]


@pytest.fixture(params=["sim", "ref"])
def backend(request):
    nt.set_backend(request.param)
    yield request.param
    nt.set_backend("sim")


def test_append_mutates_the_torch_cache(rng, backend):
    from nki_kernels.paged_kv_append import append_paged_kv_cache_ref
    args = make_append_case(rng, [9, 4], [3, 4], 4, 2, 8)
    expected = append_paged_kv_cache_ref(*args)
    targs = as_torch(args)
    torch.ops.nki_kernels.append_paged_kv_cache(*targs)
    np.testing.assert_array_equal(targs[4].numpy().view(np.uint32), expected.view(np.uint32))


def test_decode_and_scatter_match_references(rng, backend):
    from nki_kernels.paged_attention import batch_decode_ref
    from nki_kernels.tensor_scatter import tensor_scatter_ref
    args = make_decode_case(rng, [20, 1], 8, 2, 2, 16)
    out, lse = torch.ops.nki_kernels.batch_decode(*as_torch(args), None, 0.0, -1, None)
    ref, ref_lse = batch_decode_ref(*args, return_lse=True)
    np.testing.assert_allclose(out.numpy(), ref, atol=2e-5)
    np.testing.assert_allclose(lse.numpy(), ref_lse, atol=2e-4)
    cache, update = rng.standard_normal((2, 3, 8, 4)), rng.standard_normal((2, 3, 2, 4))
    w = np.array([7, 1])
    got = torch.ops.nki_kernels.tensor_scatter(torch.from_numpy(cache.astype(np.float32)),
                                               torch.from_numpy(update.astype(np.float32)),
                                               torch.from_numpy(w), 2, "circular")
    np.testing.assert_array_equal(got.numpy(), tensor_scatter_ref(cache.astype(np.float32),
                                                                  update.astype(np.float32), w, 2, "circular"))


def test_prefill_with_fused_write_matches_references(rng, backend):
    """batch_prefill with append rows: the cache ends as the reference append leaves it and the
    output is the reference attention over it, on both backends (a mixed batch)."""
    from nki_kernels.paged_attention import batch_prefill_ref
    from nki_kernels.paged_kv_append import append_paged_kv_cache_ref, get_batch_indices_positions

    from ..kernels.paged_attention.test_prefill import make_prefill_case
    q, cache, qo, ptr, idx, last, layout = make_prefill_case(rng, [3, 1], [9, 20], 4, 2, 2, 8)
    key, value = (rng.standard_normal((4, 2, 8)).astype(np.float32) for _ in range(2))
    batch, pos = get_batch_indices_positions(qo, np.array([9, 20], np.int32), 4)
    want_cache = append_paged_kv_cache_ref(key, value, batch, pos, cache, idx, ptr, last)
    cache_t = torch.from_numpy(cache.copy())
    out, lse = torch.ops.nki_kernels.batch_prefill(
        *as_torch([q, cache_t, qo, ptr, idx, last]), layout, True,
        append_key=torch.from_numpy(key), append_value=torch.from_numpy(value))
    np.testing.assert_array_equal(cache_t.numpy(), want_cache)
    ref, ref_lse = batch_prefill_ref(q, want_cache, qo, ptr, idx, last, layout, causal=True,
                                     return_lse=True)
    np.testing.assert_allclose(out.numpy(), ref, atol=2e-5)
    np.testing.assert_allclose(lse.numpy(), ref_lse, atol=2e-4)


def test_prefill_with_a_tree_mask(rng, backend):
    """Tree attention through the op: draft trees as a bool custom_mask tensor."""
    from nki_kernels.paged_attention import batch_prefill_ref, tree_mask

    from ..kernels.paged_attention.test_prefill import make_prefill_case
    q, cache, qo, ptr, idx, last, layout = make_prefill_case(rng, [4, 3], [30, 9], 4, 2, 2, 8)
    mask = np.concatenate([tree_mask([-1, 0, 0, 1], 26).reshape(-1),
                           tree_mask([-1, -1, 1], 6).reshape(-1)])
    out, lse = torch.ops.nki_kernels.batch_prefill(
        *as_torch([q, cache, qo, ptr, idx, last]), layout, False,
        custom_mask=torch.from_numpy(mask))
    ref, ref_lse = batch_prefill_ref(q, cache, qo, ptr, idx, last, layout, custom_mask=mask,
                                     return_lse=True)
    np.testing.assert_allclose(out.numpy(), ref, atol=2e-5)
    np.testing.assert_allclose(lse.numpy(), ref_lse, atol=2e-4)


def test_bf16_tensors_round_trip(rng):
    args = make_decode_case(rng, [12], 4, 1, 2, 16, q_dtype=np.float32)
    q = torch.from_numpy(args[0]).to(torch.bfloat16)
    cache = torch.from_numpy(args[1].astype(np.float32)).to(torch.bfloat16)
    out, _ = torch.ops.nki_kernels.batch_decode(q, cache, *as_torch(args[2:5]), "NHD", None, 0.0, -1, None)
    assert out.dtype == torch.bfloat16 and out.shape == q.shape
    from nki_kernels.paged_attention import batch_decode_ref
    ref = batch_decode_ref(to_numpy(q), to_numpy(cache), *args[2:5])
    np.testing.assert_allclose(out.float().numpy(), ref.astype(np.float32), atol=3e-2)


def test_torch_compile_traces_the_ops(rng):
    args = make_decode_case(rng, [6, 3], 4, 1, 2, 8)
    targs = as_torch(args)

    def step(q, cache, kv_indptr, kv_indices, last):
        out, lse = torch.ops.nki_kernels.batch_decode(q * 2.0, cache, kv_indptr, kv_indices, last,
                                                      "NHD", None, 0.0, -1, None)
        return out + 1.0, lse

    compiled = torch.compile(step, backend="aot_eager", fullgraph=True)
    got, lse = compiled(*targs[:5])
    want, want_lse = step(*targs[:5])
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(lse, want_lse)


def test_opcheck(rng):
    args = make_append_case(rng, [5], [2], 4, 1, 4)
    torch.library.opcheck(torch.ops.nki_kernels.append_paged_kv_cache.default, tuple(as_torch(args)),
                          test_utils=("test_schema", "test_faketensor"))
    dec = make_decode_case(rng, [5], 4, 1, 1, 4)
    torch.library.opcheck(torch.ops.nki_kernels.batch_decode.default,
                          tuple(as_torch(dec)) + (None, 0.0, -1, None),
                          test_utils=("test_schema", "test_faketensor"))


def test_neuron_device_path_needs_the_sdk():
    from nki_kernels.torch import device
    with pytest.raises(RuntimeError, match="torch-neuronx|Neuron SDK"):
        device.append_on_neuron(*([None] * 9))
