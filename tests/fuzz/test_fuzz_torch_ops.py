"""Property-based fuzzing of the torch custom ops on CPU tensors (the simulator behind them), on
trn1 and trn2: the same bytes as the NumPy entries, and torch-level misuse (a cache autograd
tracks, a strided cache, tensors on another device, int64 tables) refused with nothing written."""

import numpy as np
import pytest
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

from nki_kernels.paged_attention import batch_decode_ref  # noqa: E402
from nki_kernels.paged_kv_append import append_paged_kv_cache_ref  # noqa: E402
from nki_kernels.torch import block_tables as torch_block_tables  # noqa: E402
from nki_kernels.torch import ops  # noqa: E402  (registers torch.ops.nki_kernels)

from .cases import BUDGETS, append_cases, bits, on_target, run  # noqa: E402
from .test_fuzz_append import (_check_written, _with_original, block_table_args,  # noqa: E402
                               sorted_append_cases)
from .test_fuzz_attention import TOL, attention_cases  # noqa: E402
from .test_fuzz_tensor_scatter import definition, scatter_cases  # noqa: E402

TORCH_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def _tensor(a):
    """A torch tensor sharing ``a``'s bytes (bf16 through a uint16 view)."""
    if a.dtype.name == "bfloat16":
        return torch.from_numpy(a.view(np.uint16)).view(torch.bfloat16)
    return torch.from_numpy(a)


@pytest.fixture(autouse=True)
def _simulator_backend():
    """The ops must run the kernels in the simulator here, not the NumPy references."""
    assert ops.get_backend() == "sim"


def _bytes(x):
    x = x.detach().contiguous()
    return bits((x.view(torch.int16) if x.dtype == torch.bfloat16 else x).numpy())


def _fused_cases():
    return append_cases().filter(lambda c: c["fused"] and c["dtype"].__name__ != "float8_e4m3fn"
                                 and np.dtype(c["dtype"]).name in TORCH_DTYPES)


def _append_tensors(c):
    return [_tensor(np.ascontiguousarray(x)) for x in
            (c["key"], c["value"], c["batch_indices"], c["positions"], c["cache"],
             c["kv_indices"], c["kv_indptr"], c["kv_last_page_len"])]


@pytest.mark.parametrize("budget", BUDGETS)
def test_append_op_writes_what_the_reference_writes(budget):
    def prop(c):
        want = append_paged_kv_cache_ref(c["key"], c["value"], c["batch_indices"],
                                         c["positions"], c["cache"], c["kv_indices"],
                                         c["kv_indptr"], c["kv_last_page_len"], c["layout"])
        t = _append_tensors(c)
        with on_target(c):
            torch.ops.nki_kernels.append_paged_kv_cache(*t, c["layout"])
        assert np.array_equal(bits(c["cache"]), bits(want))
    run(prop, _fused_cases(), 30, budget)


def corrupt(t, kind):
    """Torch-level misuse of the append op's tensors ``t``; the refusal's text."""
    if kind == "cache requires grad" and t[4].is_floating_point():
        t[4] = t[4].clone().requires_grad_(True)
        return "requires grad"
    if kind == "indices on the meta device":
        t[5] = t[5].to("meta")
        return "kv_indices is on meta"
    if kind == "strided cache":
        # the first half of a cache twice as wide: strided whatever its size (a [::2] slice of
        # pages is contiguous after all when the cache has one page)
        t[4] = torch.cat([t[4], t[4]], dim=-1)[..., :t[4].shape[-1]]
        return "C-contiguous"
    if kind == "int64 positions":
        t[3] = t[3].to(torch.int64)
        return "positions"
    return None


KINDS = ["cache requires grad", "indices on the meta device", "strided cache", "int64 positions"]


@pytest.mark.parametrize("budget", BUDGETS)
def test_misused_append_op_is_refused_and_writes_nothing(budget):
    def prop(case):
        c, kind = case
        t = _append_tensors(c)
        expect = corrupt(t, kind)
        before = [_bytes(x) if x.device.type == "cpu" else None for x in t]
        with on_target(c), pytest.raises((RuntimeError, ValueError, TypeError)) as err:
            torch.ops.nki_kernels.append_paged_kv_cache(*t, c["layout"])
        assert expect in str(err.value), (kind, str(err.value))
        for x, b in zip(t, before):
            if b is not None:
                assert np.array_equal(_bytes(x), b), f"{kind}: a tensor changed"
    run(prop, st.tuples(_fused_cases(), st.sampled_from(KINDS)), 30, budget)


@pytest.mark.parametrize("budget", BUDGETS)
def test_decode_op_matches_the_reference(budget):
    cases = attention_cases().filter(lambda c: c["fused"] and c["options"]["sinks"] is None
                                     and np.dtype(c["dtype"]).itemsize > 1)

    def prop(c):
        o = c["options"]
        with on_target(c):
            out, lse = torch.ops.nki_kernels.batch_decode(
                _tensor(c["q"]), _tensor(c["cache"]), _tensor(c["kv_indptr"]),
                _tensor(c["kv_indices"]), _tensor(c["kv_last_page_len"]), c["layout"],
                o["sm_scale"], o["logits_soft_cap"], o["window_left"])
        want = batch_decode_ref(c["q"], c["cache"], c["kv_indptr"], c["kv_indices"],
                                c["kv_last_page_len"], c["layout"], **o)
        tol = TOL[np.dtype(c["dtype"]).name]
        np.testing.assert_allclose(out.float().numpy(), want.astype(np.float64), atol=tol, rtol=tol)
        assert lse.shape == tuple(c["q"].shape[:2])
    run(prop, cases, 15, budget)


@pytest.mark.parametrize("budget", BUDGETS)
def test_tensor_scatter_op_equals_the_definition(budget):
    cases = scatter_cases().filter(lambda c: c["past"].dtype.name in
                                   ("float32", "float16", "bfloat16", "int8", "int64", "bool"))

    def prop(c):
        want = definition(c["past"], c["update"].copy(), c["w"], c["axis"], c["mode"])
        before = bits(c["past"])
        with on_target(c):
            got = torch.ops.nki_kernels.tensor_scatter(
                _tensor(c["past"]), _tensor(np.ascontiguousarray(c["update"])),
                torch.from_numpy(c["w"]), c["axis"], c["mode"])
        got = got.view(torch.uint16).numpy().view(c["past"].dtype) \
            if got.dtype == torch.bfloat16 else got.numpy()
        assert np.array_equal(bits(got), bits(want))
        assert np.array_equal(bits(c["past"]), before), "the functional op wrote past_cache"
    run(prop, cases, 30, budget)


@pytest.mark.parametrize("budget", BUDGETS)
def test_torch_block_table_append_writes_what_append_writes(budget):
    """vLLM-neuron's arguments as CPU tensors: the (k, v) cache tensors written in place, bit
    for bit as the reference append, nothing outside the write set."""
    cases = sorted_append_cases().filter(lambda c: np.dtype(c["dtype"]).name in TORCH_DTYPES)

    def prop(c):
        _with_original(c)
        tables, seq_lens, qsl = block_table_args(c)
        with on_target(c):
            torch_block_tables.append_kv_with_block_tables(
                _tensor(np.ascontiguousarray(c["key"])), _tensor(np.ascontiguousarray(c["value"])),
                tuple(_tensor(a) for a in c["cache"]), torch.from_numpy(tables),
                torch.from_numpy(seq_lens), torch.from_numpy(qsl), c["layout"])
        _check_written(c, c["cache"])
    run(prop, cases, 20, budget)


def test_one_page_cache_strided_by_page_is_contiguous_and_empty_append_of_strided_is_refused():
    """Regression (a fresh draw): a [::2] slice of a one-page cache is contiguous (it was the
    fuzz's 'strided' corruption, so an empty append was wrongly expected to fail); a really
    strided cache is refused whatever the number of rows, empty appends included."""
    cache = torch.zeros((1, 2, 1, 1, 4))
    one_page = torch.cat([cache, cache], 0)[::2]
    strided = torch.cat([cache, cache], dim=-1)[..., :4]
    empty = torch.zeros((0, 1, 4))
    idx = [torch.zeros(0, dtype=torch.int32)] * 2
    table = (torch.zeros(1, dtype=torch.int32), torch.tensor([0, 1], dtype=torch.int32),
             torch.ones(1, dtype=torch.int32))
    torch.ops.nki_kernels.append_paged_kv_cache(empty, empty, *idx, one_page, *table, "NHD")
    before = strided.clone()
    with pytest.raises(ValueError, match="C-contiguous"):
        torch.ops.nki_kernels.append_paged_kv_cache(empty, empty, *idx, strided, *table, "NHD")
    assert torch.equal(strided, before)
