"""The kernels as the CLI and benchmarks see them: inputs for given sizes, kernel, reference,
comparison, and the physical minimum of bytes and FLOPs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict

import ml_dtypes
import numpy as np

DTYPES = {"float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16,
          "float8_e4m3fn": ml_dtypes.float8_e4m3fn}


@dataclass(frozen=True)
class KernelSpec:
    name: str
    doc: str
    make: Callable           # (sizes, rng) -> inputs dict
    run: Callable            # inputs -> result (simulator / hardware)
    ref: Callable            # inputs -> result (NumPy)
    tolerance: Callable      # inputs -> atol (0 = bit exact)
    min_bytes: Callable      # inputs -> bytes that must cross HBM
    flops: Callable          # inputs -> FLOPs
    demo: Dict[str, object]
    bench: Dict[str, object]
    variants: tuple = ({},)          # bench: extra runs overriding some sizes (e.g. the layout)


def _page_table(rng, kv_lens, page_size, spare=2):
    pages = -(-np.asarray(kv_lens) // page_size)
    n = int(pages.sum()) + spare
    kv_indptr = np.concatenate([[0], np.cumsum(pages)]).astype(np.int32)
    kv_indices = rng.permutation(n).astype(np.int32)[:kv_indptr[-1]]
    last = np.where(np.asarray(kv_lens) > 0, (np.asarray(kv_lens) - 1) % page_size + 1, 0).astype(np.int32)
    return n, kv_indptr, kv_indices, last


# -- tensor_scatter --------------------------------------------------------------------------
def _ts_make(s, rng):
    dt = DTYPES[s.get("dtype", "float32")]
    B, H, M, S, D = (int(s[k]) for k in ("batch", "heads", "max_seq", "seq_len", "head_dim"))
    cache = rng.standard_normal((B, H, M, D)).astype(dt)
    update = rng.standard_normal((B, H, S, D)).astype(dt)
    hi = M if s.get("mode", "linear") == "circular" else M - S + 1
    return dict(past_cache=cache, update=update, write_indices=rng.integers(0, hi, B).astype(np.int64),
                axis=2, mode=s.get("mode", "linear"))


def _ts_run(i):
    from nki_kernels.tensor_scatter import tensor_scatter
    return tensor_scatter(**i)


def _ts_ref(i):
    from nki_kernels.tensor_scatter import tensor_scatter_ref
    return tensor_scatter_ref(**i)


# -- paged_kv_append -------------------------------------------------------------------------
def _ap_make(s, rng):
    dt = DTYPES[s.get("dtype", "float32")]
    B, L, T = int(s["batch"]), int(s["kv_len"]), int(s["append"])
    P, H, D, layout = int(s["page_size"]), int(s["kv_heads"]), int(s["head_dim"]), s.get("layout", "NHD")
    n, kv_indptr, kv_indices, last = _page_table(rng, [L] * B, P)
    inner = (P, H, D) if layout == "NHD" else (H, P, D)
    cache = rng.standard_normal((n, 2) + inner).astype(dt)
    from nki_kernels.paged_kv_append import get_batch_indices_positions
    append_indptr = (np.arange(B + 1) * T).astype(np.int32)
    batch, pos = get_batch_indices_positions(append_indptr, np.full(B, L, np.int32), B * T)
    k = rng.standard_normal((B * T, H, D)).astype(dt)
    return dict(append_key=k, append_value=-k, batch_indices=batch, positions=pos, paged_kv_cache=cache,
                kv_indices=kv_indices, kv_indptr=kv_indptr, kv_last_page_len=last, kv_layout=layout)


def _ap_run(i):
    from nki_kernels.paged_kv_append import append_paged_kv_cache
    i = dict(i, paged_kv_cache=i["paged_kv_cache"].copy())
    append_paged_kv_cache(**i)
    return i["paged_kv_cache"]


def _ap_ref(i):
    from nki_kernels.paged_kv_append import append_paged_kv_cache_ref
    return append_paged_kv_cache_ref(**i)


# -- paged attention (decode, prefill) --------------------------------------------------------
def _paged_case(s, rng, q_lens, kv_lens):
    """A random paged cache holding ``kv_lens`` tokens per request and q with ``q_lens`` rows per
    request (bf16 q for an fp8 cache), from the sizes' dtype, page, heads and layout."""
    dt = DTYPES[s.get("dtype", "float32")]
    P, H, G, D = (int(s[k]) for k in ("page_size", "kv_heads", "group", "head_dim"))
    layout = s.get("layout", "NHD")
    n, kv_indptr, kv_indices, last = _page_table(rng, kv_lens, P)
    inner = (P, H, D) if layout == "NHD" else (H, P, D)
    cache = rng.standard_normal((n, 2) + inner).astype(dt)
    q_dt = dt if dt != ml_dtypes.float8_e4m3fn else ml_dtypes.bfloat16
    q = rng.standard_normal((int(sum(q_lens)), H * G, D)).astype(q_dt)
    return dict(q=q, paged_kv_cache=cache, kv_indptr=kv_indptr, kv_indices=kv_indices,
                kv_last_page_len=last, kv_layout=layout)


def _drawn_kv_lens(s, rng, B, least=0):
    """``B`` requests' keys: ``kv_len`` each, or (``kv_min`` given) drawn uniformly from
    [max(kv_min, least), kv_len] (a serving batch's spread)."""
    L = int(s["kv_len"])
    if "kv_min" not in s:
        return [L] * B
    return [int(n) for n in rng.integers(max(int(s["kv_min"]), least), L + 1, B)]


def _dec_make(s, rng):
    """``batch`` requests of ``kv_len`` keys each, or (``kv_min`` given) of lengths drawn
    uniformly from [kv_min, kv_len] (a serving batch's spread)."""
    B = int(s["batch"])
    return _paged_case(s, rng, [1] * B, _drawn_kv_lens(s, rng, B))


def _dec_run(i):
    from nki_kernels.paged_attention import batch_decode
    return batch_decode(**i)


def _dec_ref(i):
    from nki_kernels.paged_attention import batch_decode_ref
    return batch_decode_ref(**i)


def _kv_lens(i):
    """Each request's KV tokens (int64 [B]) and the kv heads, from the page table."""
    cache, layout = i["paged_kv_cache"], i["kv_layout"]
    P = cache.shape[2] if layout == "NHD" else cache.shape[3]
    H = cache.shape[3] if layout == "NHD" else cache.shape[2]
    pages = np.diff(i["kv_indptr"]).astype(np.int64)
    return np.where(pages > 0, (pages - 1) * P + i["kv_last_page_len"], 0), H


def _dec_bytes(i):
    lens, H = _kv_lens(i)
    D = i["q"].shape[2]
    return 2 * int(lens.sum()) * H * D * i["paged_kv_cache"].itemsize + 2 * i["q"].nbytes


def _dec_flops(i):
    lens, _ = _kv_lens(i)
    HQ, D = i["q"].shape[1:]
    return 4 * int(lens.sum()) * HQ * D            # QK^T and PV, 2 FLOPs per multiply-add


# -- paged_prefill_attention (ragged queries) -------------------------------------------------
def _pf_make(s, rng):
    """``batch`` requests of ``q_len`` new tokens over ``kv_len`` keys each (the new ones
    included), plus with ``prefill`` > 0 one more request: a prefill chunk of that many tokens
    over ``prefill_kv`` keys (a mixed batch); ``kv_min`` given: the requests' keys drawn
    uniformly from [max(kv_min, q_len), kv_len]. Causal."""
    B, extra = int(s["batch"]), int(s.get("prefill", 0))
    q_lens = [int(s["q_len"])] * B + ([extra] if extra else [])
    kv_lens = _drawn_kv_lens(s, rng, B, int(s["q_len"]))
    kv_lens += [int(s.get("prefill_kv", extra))] if extra else []
    case = _paged_case(s, rng, q_lens, kv_lens)
    qo_indptr = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    return dict(case, qo_indptr=qo_indptr, causal=True)


def _pf_run(i):
    from nki_kernels.paged_attention import batch_prefill
    return batch_prefill(**i)


def _pf_ref(i):
    from nki_kernels.paged_attention import batch_prefill_ref
    return batch_prefill_ref(**i)


def _pf_flops(i):
    from nki_kernels.paged_attention.work import causal_pairs
    HQ, D = i["q"].shape[1:]
    return 4 * causal_pairs(np.diff(i["qo_indptr"]), _kv_lens(i)[0]) * HQ * D


# -- tree verification (custom masks) and cascade (shared prefix) ----------------------------
def _tree_make(s, rng):
    """``batch`` requests verifying a random draft tree of ``q_len`` tokens each over
    ``kv_len`` keys (the drafts included): ``_pf_make`` with a packed custom mask (FlashInfer's
    ``segment_packbits(..., "little")``) instead of ``causal``."""
    from nki_kernels.paged_attention.custom_mask import segment_packbits, tree_mask
    case = _pf_make(s, rng)
    n, L, B = int(s["q_len"]), int(s["kv_len"]), int(s["batch"])
    masks = [tree_mask([int(rng.integers(-1, i)) for i in range(n)], L - n) for _ in range(B)]
    bits, indptr = segment_packbits(np.concatenate([m.reshape(-1) for m in masks]),
                                    np.arange(B + 1) * n * L, bitorder="little")
    return dict(case, causal=False, packed_custom_mask=bits, mask_indptr=indptr)


def _cascade_make(s, rng):
    """``batch`` decode requests sharing a prefix of ``shared`` tokens, each with ``kv_len``
    private tokens after it: two cascade levels over one cache."""
    B, S, L = int(s["batch"]), int(s["shared"]), int(s["kv_len"])
    case = _paged_case(s, rng, [1] * B, [S] + [L] * B)
    P = case["paged_kv_cache"].shape[2 if case["kv_layout"] == "NHD" else 3]
    ptr, idx, last = case.pop("kv_indptr"), case.pop("kv_indices"), case.pop("kv_last_page_len")
    i32 = lambda a: np.asarray(a, np.int32)            # noqa: E731
    shared_pages = int(ptr[1])
    return dict(case, qo_indptr_arr=[i32([0, B]), i32(np.arange(B + 1))],
                kv_indptr_arr=[i32([0, shared_pages]), i32(ptr[1:] - shared_pages)],
                kv_indices_arr=[i32(idx[:shared_pages]), i32(idx[shared_pages:])],
                kv_last_page_len_arr=[i32(last[:1]), i32(last[1:])], page=P)


def _cascade_run(i):
    from nki_kernels.paged_attention import cascade_attention
    i = dict(i)
    i.pop("page")
    return cascade_attention(**i)


def _cascade_ref(i):
    from nki_kernels.paged_attention import cascade_attention_ref
    i = dict(i)
    i.pop("page")
    return cascade_attention_ref(**i)


def _cascade_keys(i):
    """Keys read once (the shared prefix's and every request's private ones) and keys
    attended (per query: its prefix and its own)."""
    P = i["page"]
    lens = []
    for ptr, last in zip(i["kv_indptr_arr"], i["kv_last_page_len_arr"]):
        pages = np.diff(ptr).astype(np.int64)
        lens.append(np.where(pages > 0, (pages - 1) * P + last, 0))
    return int(sum(x.sum() for x in lens)), int(lens[0].sum() * i["q"].shape[0] + lens[1].sum())


def _cascade_bytes(i):
    cache = i["paged_kv_cache"]
    H = cache.shape[3] if i["kv_layout"] == "NHD" else cache.shape[2]
    return 2 * _cascade_keys(i)[0] * H * i["q"].shape[2] * cache.itemsize + 2 * i["q"].nbytes


def _cascade_flops(i):
    HQ, D = i["q"].shape[1:]
    return 4 * _cascade_keys(i)[1] * HQ * D


KERNELS = {
    "tensor_scatter": KernelSpec(
        "tensor_scatter", "ONNX TensorScatter-24 KV-cache update (in place)", _ts_make, _ts_run, _ts_ref,
        lambda i: 0.0, lambda i: 2 * i["update"].nbytes, lambda i: 0,
        demo=dict(batch=4, heads=8, max_seq=256, seq_len=7, head_dim=64, mode="circular"),
        bench=dict(batch=32, heads=8, max_seq=4096, seq_len=1, head_dim=128, mode="linear"),
        variants=(dict(seq_len=1), dict(seq_len=300, mode="circular"))),
    "paged_kv_append": KernelSpec(
        "paged_kv_append", "FlashInfer append_paged_kv_cache (in place)", _ap_make, _ap_run, _ap_ref,
        lambda i: 0.0, lambda i: 2 * (i["append_key"].nbytes + i["append_value"].nbytes), lambda i: 0,
        demo=dict(batch=8, kv_len=100, append=20, page_size=16, kv_heads=4, head_dim=64),
        bench=dict(batch=32, kv_len=4096, append=1, page_size=16, kv_heads=8, head_dim=128),
        variants=(dict(layout="NHD"), dict(layout="HND"))),
    "paged_decode_attention": KernelSpec(
        "paged_decode_attention", "FlashInfer batch decode over a paged KV cache", _dec_make, _dec_run,
        _dec_ref, lambda i: {"float32": 2e-5, "float16": 2e-3}.get(i["q"].dtype.name, 2e-2), _dec_bytes,
        _dec_flops,
        demo=dict(batch=4, kv_len=300, page_size=16, kv_heads=2, group=4, head_dim=64),
        bench=dict(batch=32, kv_len=4096, page_size=16, kv_heads=8, group=4, head_dim=128,
                   dtype="bfloat16"),
        variants=(dict(layout="NHD"), dict(layout="HND"))),
    "paged_prefill_attention": KernelSpec(
        "paged_prefill_attention", "FlashInfer batch prefill (ragged causal queries) over a paged "
        "KV cache: speculative verification, chunked prefill, mixed batches", _pf_make, _pf_run,
        _pf_ref, lambda i: {"float32": 2e-5, "float16": 2e-3}.get(i["q"].dtype.name, 2e-2),
        _dec_bytes, _pf_flops,
        demo=dict(batch=3, q_len=5, kv_len=300, page_size=16, kv_heads=2, group=4, head_dim=64,
                  prefill=70, prefill_kv=200),
        bench=dict(batch=32, q_len=4, kv_len=4096, page_size=16, kv_heads=8, group=4,
                   head_dim=128, dtype="bfloat16"),
        variants=(dict(), dict(batch=1, q_len=1024, kv_len=1024),
                  dict(batch=1, q_len=1024, kv_len=8192),
                  dict(batch=31, q_len=1, prefill=512, prefill_kv=2048))),
    "paged_tree_verification": KernelSpec(
        "paged_tree_verification", "FlashInfer batch prefill with a packed custom mask: draft "
        "trees of speculative decoding verified in one step", _tree_make, _pf_run, _pf_ref,
        lambda i: {"float32": 2e-5, "float16": 2e-3}.get(i["q"].dtype.name, 2e-2),
        _dec_bytes, _pf_flops,
        demo=dict(batch=3, q_len=6, kv_len=200, page_size=16, kv_heads=2, group=4, head_dim=64),
        bench=dict(batch=16, q_len=8, kv_len=1024, page_size=16, kv_heads=8, group=4,
                   head_dim=128, dtype="bfloat16")),
    "cascade_attention": KernelSpec(
        "cascade_attention", "FlashInfer multi-level cascade: decode requests sharing a prefix, "
        "the prefix read once per step", _cascade_make, _cascade_run, _cascade_ref,
        lambda i: {"float32": 2e-5, "float16": 2e-3}.get(i["q"].dtype.name, 2e-2),
        _cascade_bytes, _cascade_flops,
        demo=dict(batch=5, shared=300, kv_len=40, page_size=16, kv_heads=2, group=4,
                  head_dim=64),
        bench=dict(batch=32, shared=4096, kv_len=256, page_size=16, kv_heads=8, group=4,
                   head_dim=128, dtype="bfloat16")),
}


def step_floor(spec: KernelSpec, inputs, hw, cores: int = 1):
    """The run's floor (``profile.floor``) on ``cores`` cores of ``hw``: its minimum bytes and,
    for attention (FLOPs = 4 x head_dim per score), its scores' FLOPs and elementwise passes."""
    from nki_kernels.profile.floor import attention_floor
    flops = int(spec.flops(inputs))
    head_dim = int(inputs["q"].shape[-1]) if flops else 1
    return attention_floor(hw, int(spec.min_bytes(inputs)), flops // (4 * head_dim), head_dim,
                           cores)


def compare(spec: KernelSpec, inputs, out, ref):
    """(ok, max abs error) of a kernel result against the reference."""
    atol = spec.tolerance(inputs)
    a, b = np.asarray(out), np.asarray(ref)
    if atol == 0.0:
        ok = a.shape == b.shape and np.array_equal(a.view(np.uint8), b.view(np.uint8))
        return ok, 0.0 if ok else float("nan")
    err = float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64)))) if a.size else 0.0
    return err <= atol * (1 + float(np.max(np.abs(b.astype(np.float64)), initial=0))), err
