"""An attention implementation for HF transformers' continuous batching that writes the step's
K/V into transformers' own paged cache and attends through our kernels.

transformers calls it once per layer and step with packed queries (every request's new tokens
one after the other), ``cu_seq_lens_q`` / ``cu_seq_lens_k``, the cache and its physical
``read_index`` / ``write_index`` (see ``cache_views``):

* full-attention layers: one ``batch_prefill`` launch with the fused write (``append_key``):
  the page table comes from the read rows, the new rows land where ``write_index`` says
  (checked), causal over the request's cache and new tokens.
* sliding-window layers (a ring of W tokens per request; a new token may overwrite one an
  earlier query of the same chunk still sees, so every read comes before the write):
  ``batch_prefill`` over the new tokens (causal, window W), ``batch_decode`` of each query over
  the cached tokens it sees (pages of one token), the two merged by their LSE
  (``merge_states``), then ``reshape_and_cache`` writes the new rows into the ring.

Soft cap (``softcap``), sinks (``s_aux`` or ``module.sinks``), the scale and GQA are the kernels'
own options. Everything runs on CPU tensors through the NKI simulator (or, with
``set_backend("ref")`` of ``nki_kernels.torch``, the NumPy references).
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import torch

from nki_kernels.paged_attention import batch_decode, batch_prefill, merge_states
from nki_kernels.paged_kv_append import reshape_and_cache
from nki_kernels.torch.convert import to_numpy, to_torch

from .cache_views import LayerCache, host, layer_cache, page_table, token_table

#: What the implementation did since the last ``clear()``: layer calls per path ("full",
#: "ring"), "queries", "shared_pages" (pages read by two requests of one step: prefix caching),
#: "cached_reads" (ring rows read by the decode part) and "dropped_writes"
#: (tokens beyond a ring's window, not written).
counts: Counter = Counter()


def nki_paged_attention_forward(module, query, key, value, attention_mask, scaling=None,
                                dropout=0.0, sliding_window=None, softcap=None, s_aux=None,
                                **kwargs):
    """transformers' attention interface: query [1, HQ, Q, D], key / value [1, H, Q, D] (the step's
    packed tokens) -> (out [1, Q, HQ, D], None). ``sliding_window`` (the module's) is not read:
    the layer's cache group decides, as it does for transformers' own paths."""
    cache = kwargs.get("cache")
    if cache is None or "write_index" not in kwargs:
        raise ValueError("nki_paged_flash attention runs under continuous batching "
                         "(model.generate_batch / init_continuous_batching), which passes the paged "
                         "cache and its indices; for a plain forward use 'eager' or 'sdpa'")
    if query.device.type != "cpu":
        raise NotImplementedError(f"nki_paged_flash runs transformers' continuous batching on CPU "
                                  f"(the NKI simulator); got tensors on {query.device}. On Trainium "
                                  f"call nki_kernels.torch ops from the serving stack (docs/serving.md)")
    if dropout:
        raise ValueError(f"dropout={dropout}: the paged kernels are for inference (dropout 0)")
    allocator = cache.layer_to_allocator[module.layer_idx]
    layer = layer_cache(allocator, module.layer_idx)
    step = _Step.of(kwargs, allocator, query.shape[2])
    q = np.ascontiguousarray(to_numpy(query[0].transpose(0, 1)))
    cache_dtype = allocator.cache_tensor.dtype
    k, v = (np.ascontiguousarray(to_numpy(x[0].transpose(0, 1).to(cache_dtype))) for x in (key, value))
    sinks = s_aux if s_aux is not None else getattr(module, "sinks", None)
    options = dict(sm_scale=float(scaling) if scaling is not None else None,
                   logits_soft_cap=float(softcap) if softcap else 0.0)
    sinks = None if sinks is None else to_numpy(sinks.detach().float()).copy()
    n = step.total_q
    counts["queries"] += n
    if getattr(allocator, "sliding_window", None) is None:
        # the layer's cache type decides, as for transformers' own paths (their mask is built per
        # layer type): a full-attention cache group attends to every cached token
        out = _full_layer(q[:n], k[:n], v[:n], layer, step, sinks, options)
    else:
        out = _ring_layer(q[:n], k[:n], v[:n], layer, step, int(allocator.sliding_window),
                          allocator.write_trash_index, sinks, options)
    result = torch.zeros(query.shape[2], query.shape[1], query.shape[3], dtype=query.dtype)
    result[:n] = to_torch(np.asarray(out, q.dtype))
    return result.unsqueeze(0), None


class _Step:
    """The step's per-request facts for one layer group, on the host (int64)."""

    def __init__(self, cu_q, cu_k, read, write):
        self.cu_q, self.cu_k, self.read, self.write = cu_q, cu_k, read, write
        self.q_lens = np.diff(cu_q)
        self.kv_lens = np.diff(cu_k)
        self.total_q = int(cu_q[-1])

    @classmethod
    def of(cls, kwargs, allocator, padded_q):
        cu_k = kwargs["cu_seq_lens_k"]
        cu_k = cu_k[allocator.layer_type] if isinstance(cu_k, dict) else cu_k
        read, write = (kwargs[name][allocator.index] for name in ("read_index", "write_index"))
        step = cls(host(kwargs["cu_seq_lens_q"]), host(cu_k), host(read), host(write))
        if step.total_q > padded_q:
            raise ValueError(f"cu_seq_lens_q ends at {step.total_q} but the query has {padded_q} tokens")
        return step

    def queries(self, b):
        return slice(int(self.cu_q[b]), int(self.cu_q[b + 1]))

    def keys(self, b):
        return slice(int(self.cu_k[b]), int(self.cu_k[b + 1]))

    def cu_q32(self):
        return self.cu_q.astype(np.int32)


def _full_layer(q, k, v, layer: LayerCache, step: _Step, sinks, options):
    """One fused write + attention launch over whole pages."""
    counts["full"] += 1
    B = step.q_lens.size
    if step.read.size:
        rows = [step.read[step.keys(b)] for b in range(B)]
    else:                                   # no request has cached tokens: it reads what it writes
        if not np.array_equal(step.q_lens, step.kv_lens):
            raise ValueError("read_index is empty but some request has cached tokens")
        rows = [step.write[step.queries(b)] for b in range(B)]
    indptr, indices, last = page_table(rows, layer.page_size)
    counts["shared_pages"] += int(indices.size - np.unique(indices).size)
    for b, r in enumerate(rows):                 # the kernel writes position kv_len - q_len + i
        if not np.array_equal(r[r.size - step.q_lens[b]:], step.write[step.queries(b)]):
            raise ValueError(f"request {b}: write_index is not the continuation of its read rows")
    return batch_prefill(q, layer.fused, step.cu_q32(), indptr, indices, last, causal=True,
                         sinks=sinks, append_key=k, append_value=v, **options)


def _ring_layer(q, k, v, layer: LayerCache, step: _Step, W, trash, sinks, options):
    """Sliding window over a ring: new tokens (causal, window W) merged with each query's cached
    tokens, read before the new rows overwrite any of them."""
    counts["ring"] += 1
    B, n = step.q_lens.size, q.shape[0]
    staged = np.stack([k, v], axis=1)[:, :, None]               # [Q, 2, 1, H, D]: pages of one token
    ones = (step.q_lens > 0).astype(np.int32)
    new_out, new_lse = batch_prefill(q, np.ascontiguousarray(staged), step.cu_q32(), step.cu_q32(),
                                     np.arange(n, dtype=np.int32), ones, causal=True,
                                     window_left=W - 1, sinks=sinks, return_lse=True, **options)
    seen = []                                    # per query: the cached rows it sees, in order
    for b in range(B):
        cached = step.read[step.keys(b)][: step.kv_lens[b] - step.q_lens[b]] if step.read.size else ()
        n_old = len(cached)
        seen += [cached[max(0, n_old + j - W + 1):] for j in range(int(step.q_lens[b]))]
    out = new_out
    if any(len(s) for s in seen):
        indptr, indices, last = token_table(seen)
        counts["cached_reads"] += int(indices.size)
        old_out, old_lse = batch_decode(q, (layer.k_tokens, layer.v_tokens), indptr, indices, last,
                                        return_lse=True, **options)
        out, _ = merge_states(np.stack([new_out, old_out], axis=-2),
                              np.stack([new_lse, old_lse], axis=-1))
    dropped = step.write[:n] == trash            # tokens beyond the window's W go to HF's trash row
    slots = np.where(dropped, -1, layer.slots(np.where(dropped, 0, step.write[:n])))
    counts["dropped_writes"] += int(dropped.sum())
    reshape_and_cache(k, v, layer.fused, None, slots)
    return out
