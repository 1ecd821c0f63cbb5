"""Greedy generation for a HF ``transformers`` Llama model over our paged KV cache.

The model's own modules (embeddings, norms, projections, rotary embedding, MLP, head) compute
everything but attention's cache handling, which goes through our kernels as torch custom ops:

- ``step`` / ``prefill`` (in chunks, several requests mixed) / ``verify`` (draft tokens of
  speculative decoding): every layer writes the new tokens' K/V and attends causally in one launch,
  ``torch.ops.nki_kernels.batch_prefill`` with the fused write;
- ``decode``: ``torch.ops.nki_kernels.append_paged_kv_cache`` then
  ``torch.ops.nki_kernels.batch_decode``.

One page allocator serves all layers: they share the page table, each layer has its own cache
tensor [N, 2, P, H_kv, D] (NHD).
"""

from __future__ import annotations

from typing import List

import numpy as np
import torch

from nki_kernels.paged_kv_append import PagedKVCache, get_batch_indices_positions

from . import ops  # noqa: F401  (registers torch.ops.nki_kernels)


class PagedLlamaGenerator:
    def __init__(self, model, num_pages: int = 64, page_size: int = 4):
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb
        self.model, self.cfg = model.eval(), model.config
        self._rope = apply_rotary_pos_emb
        attn = model.model.layers[0].self_attn
        self.hkv, self.d = self.cfg.num_key_value_heads, attn.head_dim
        self.hq = self.cfg.num_attention_heads
        self.pages = PagedKVCache(num_pages, page_size, 1, 1)     # bookkeeping only
        dtype = next(model.parameters()).dtype
        self.caches = [torch.zeros((num_pages, 2, page_size, self.hkv, self.d), dtype=dtype)
                       for _ in model.model.layers]
        self.rids: List[int] = []

    # -- per-layer pieces -------------------------------------------------------------------------
    def _qkv(self, layer, h, position_ids):
        """q [B, S, Hq, D], k and v [B, S, Hkv, D] with rotary embedding applied."""
        a = layer.self_attn
        B, S, _ = h.shape
        q = a.q_proj(h).view(B, S, self.hq, self.d).transpose(1, 2)
        k = a.k_proj(h).view(B, S, self.hkv, self.d).transpose(1, 2)
        v = a.v_proj(h).view(B, S, self.hkv, self.d).transpose(1, 2)
        cos, sin = self.model.model.rotary_emb(v, position_ids)
        q, k = self._rope(q, k, cos, sin)
        return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)

    def _layer(self, i, layer, h, position_ids, attend):
        x = layer.input_layernorm(h)
        q, k, v = self._qkv(layer, x, position_ids)
        attn = attend(i, q, k, v)                                   # [B, S, Hq * D]
        h = h + layer.self_attn.o_proj(attn)
        return h + layer.mlp(layer.post_attention_layernorm(h))

    def _logits(self, h):
        return self.model.lm_head(self.model.model.norm(h))

    def _append(self, i, k, v, rids, counts):
        """Write K/V rows [T, Hkv, D] of requests ``rids`` (``counts`` each) into layer i's cache."""
        kv_indptr, kv_indices, last = self.pages.page_table(rids)
        append_indptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
        seq = np.array([self.pages.seq_len(r) for r in rids], np.int32)
        batch, pos = get_batch_indices_positions(append_indptr, seq, int(append_indptr[-1]))
        t = torch.from_numpy
        torch.ops.nki_kernels.append_paged_kv_cache(
            k.contiguous(), v.contiguous(), t(batch), t(pos), self.caches[i], t(kv_indices),
            t(kv_indptr), t(last), "NHD")

    # -- generation ---------------------------------------------------------------------------------
    @torch.no_grad()
    def step(self, rids, tokens):
        """Feed request ``rids[b]`` its new tokens ``tokens[b]`` (a list, any length) in one
        forward; every layer appends their K/V and attends through one ``batch_prefill`` launch.
        Returns the logits of every new token [sum of lengths, V], in request order."""
        counts = [len(t) for t in tokens]
        self.pages.reserve(rids, counts)
        try:
            kv_indptr, kv_indices, last = (torch.from_numpy(a) for a in self.pages.page_table(rids))
            qo = torch.from_numpy(np.concatenate([[0], np.cumsum(counts)]).astype(np.int32))
            pos = torch.tensor([[self.pages.seq_len(r) - n + j for r, n in zip(rids, counts)
                                 for j in range(n)]])
            Q = int(sum(counts))
            h = self.model.model.embed_tokens(torch.tensor([[t for ts in tokens for t in ts]]))

            def attend(i, q, k, v):
                out, _ = torch.ops.nki_kernels.batch_prefill(
                    q[0].contiguous(), self.caches[i], qo, kv_indptr, kv_indices, last, "NHD",
                    True, append_key=k[0].contiguous(), append_value=v[0].contiguous())
                return out.reshape(1, Q, self.hq * self.d)

            for i, layer in enumerate(self.model.model.layers):
                h = self._layer(i, layer, h, pos, attend)
        except BaseException:
            for r, n in zip(rids, counts):
                self.pages.truncate(r, self.pages.seq_len(r) - n)
            raise
        return self._logits(h)[0]

    def prefill(self, prompts, chunk=None):
        """Add one request per prompt and feed the prompts ``chunk`` tokens per request per
        step (None: whole), all requests with tokens left in the same step (chunked prefill,
        mixed lengths). Returns the logits of each prompt's last token [B, V]."""
        rids = []
        for _ in prompts:
            rid = len(self.rids)
            self.rids.append(rid)
            self.pages.add_request(rid)
            rids.append(rid)
        done = [0] * len(prompts)
        last = [None] * len(prompts)
        while any(d < len(p) for d, p in zip(done, prompts)):
            live = [b for b, p in enumerate(prompts) if done[b] < len(p)]
            feed = [list(prompts[b][done[b]:done[b] + (chunk or len(prompts[b]))]) for b in live]
            logits = self.step([rids[b] for b in live], feed)
            ends = np.cumsum([len(f) for f in feed]) - 1
            for b, f, e in zip(live, feed, ends):
                done[b] += len(f)
                last[b] = logits[e]
        return torch.stack(last)

    def verify(self, tokens, drafts):
        """Speculative decoding, greedy: feed each request its next token and its draft tokens
        in one step, accept the longest draft prefix the model itself would have produced, and
        drop the rest from the cache. Returns (logits of every fed token, per request [k+1, V];
        the tokens each request gains: accepted drafts plus the model's next one)."""
        feed = [[int(t)] + list(d) for t, d in zip(tokens, drafts)]
        logits = self.step(self.rids, feed)
        rows = torch.split(logits, [len(f) for f in feed])
        gained = []
        for rid, f, r in zip(self.rids, feed, rows):
            best = r.argmax(-1).tolist()
            a = 0
            while a < len(f) - 1 and f[a + 1] == best[a]:
                a += 1
            self.pages.truncate(rid, self.pages.seq_len(rid) - (len(f) - 1 - a))
            gained.append(f[1:a + 1] + [best[a]])
        return list(rows), gained

    @torch.no_grad()
    def decode(self, tokens):
        """One step for every request: ``tokens`` [B] -> logits [B, V]."""
        rids = self.rids
        self.pages.reserve(rids, 1)
        pos = torch.tensor([[self.pages.seq_len(r) - 1] for r in rids])
        kv_indptr, kv_indices, last = (torch.from_numpy(a) for a in self.pages.page_table(rids))
        h = self.model.model.embed_tokens(torch.as_tensor(tokens)[:, None])

        def attend(i, q, k, v):
            self._append(i, k[:, 0], v[:, 0], rids, [1] * len(rids))
            out, _ = torch.ops.nki_kernels.batch_decode(q[:, 0].contiguous(), self.caches[i], kv_indptr,
                                                        kv_indices, last, "NHD", None, 0.0, -1, None)
            return out.reshape(len(rids), 1, self.hq * self.d)

        for i, layer in enumerate(self.model.model.layers):
            h = self._layer(i, layer, h, pos, attend)
        return self._logits(h)[:, 0]


def tiny_llama(seed: int = 0, **overrides):
    """A small random-weight Llama (no download)."""
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
               num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=256,
               attn_implementation="eager")
    cfg.update(overrides)
    torch.manual_seed(seed)
    return LlamaForCausalLM(LlamaConfig(**cfg)).eval()
