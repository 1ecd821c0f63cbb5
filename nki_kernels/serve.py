"""Replay a continuous-batching decode trace through the kernels: ``nki-kernels serve``.

Requests arrive with prompts of mixed lengths, are appended to one paged cache (allocated once,
as a server does), then decode one token per step (append the new K/V, attend over the cache)
until their output length is reached and their pages are freed. With ``prefill_chunk`` > 0 the
steps are those of a chunked-prefill scheduler (vLLM's default): a prompt is fed at most that
many tokens per step, attending causally to its cached prefix, in the same launch as the other
requests' decode tokens (``batch_prefill`` with the fused K/V write: one launch per step). Per step it records what a
serving engineer asks of a kernel library: compilations (``nki.jit`` keys, see
``simulate.compile_stats``), instructions in the program and executed, modelled time of the
append and decode launches, HBM bytes against the minimum (the K/V bytes the step must move), and
tokens per second over the run. The simulator checks every decode step against the reference.

    trace = replay(ServeConfig(steps=64), target="trn2")
    print(summary_markdown(trace))
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List

import numpy as np

from nki_kernels.profile.floor import attention_floor


@dataclass(frozen=True)
class ServeConfig:
    steps: int = 48
    max_batch: int = 8                 # concurrent requests at most
    arrival_per_step: float = 0.5      # mean new requests per step (Poisson)
    prompt_lens: tuple = (16, 600)     # uniform range of prompt tokens
    output_lens: tuple = (4, 40)       # uniform range of generated tokens
    pages: int = 512
    page_size: int = 16
    kv_heads: int = 2
    group: int = 4                     # query heads per kv head
    head_dim: int = 64
    dtype: str = "float32"             # cache and q: float32 | bfloat16 | float16
    lnc: int = 1                       # 2: append and decode share each step over two cores
    prefill_chunk: int = 0             # > 0: chunked prefill mixed with decode (see replay)
    seed: int = 0

    @property
    def tolerance(self) -> float:
        """Max |out - reference| accepted for the dtype (attention outputs are O(1))."""
        return {"float32": 1e-4, "float16": 5e-3, "bfloat16": 3e-2}[self.dtype]


# Named configurations. "llama8b": one attention layer of Llama-3-8B (8 kv heads, 32 query heads,
# head_dim 128, bf16, 16-token pages) with prompts of up to 2k tokens and 16 concurrent requests
# in a 4096-page cache (64 MiB per layer).
PRESETS = {
    "small": ServeConfig(),
    "llama8b": ServeConfig(steps=32, max_batch=16, arrival_per_step=1.0, prompt_lens=(128, 2048),
                           output_lens=(8, 64), pages=4096, page_size=16, kv_heads=8, group=4,
                           head_dim=128, dtype="bfloat16"),
}


@dataclass
class StepRecord:
    step: int
    batch: int
    appended: int                      # tokens appended (prompts + one per decoding request)
    kv_tokens: int                     # tokens attended over
    compiles: int                      # new compile keys this step (append + decode)
    program_instructions: int          # decode program size
    executed_instructions: int         # append + decode
    seconds: float                     # modelled, append + decode
    hbm_bytes: int
    min_hbm_bytes: int
    floor_seconds: float = 0.0         # profile/floor.py on the cores used: bytes, FLOPs, passes
    band_seconds: tuple = (0.0, 0.0)   # modelled with the uncertain constants fastest / slowest
    static_chunks: int = 0             # the decode's static pass (chunks per row), 0: looped
    static_pass: tuple = ()            # its static argument (chunks, full slots, sections)


def _static_pass(q, cache, table, lnc, target):
    """The decode launch's static pass as its plan has it: (chunks per row, 0 for device loops;
    the static argument, with the batch bucket the decode kernel's compile key)."""
    from nki_kernels import simulate
    from nki_kernels.paged_attention.plan import STATIC_PASS, prepare_decode
    with simulate.use_target(target):
        launch = prepare_decode(q, cache, *table, "NHD", None, 0.0, -1, None, 1.0, 1.0, lnc)
    return launch.static_chunks, launch.statics[STATIC_PASS]


@dataclass
class ServeTrace:
    config: ServeConfig
    target: str
    steps: List[StepRecord] = field(default_factory=list)
    compilations: dict = field(default_factory=dict)      # kernel -> compiles
    max_error: float = 0.0
    overrides: dict = field(default_factory=dict)         # cost-model constants (calibration)

    @property
    def tokens_per_second(self) -> float:
        seconds = sum(s.seconds for s in self.steps)
        return sum(s.batch for s in self.steps) / seconds if seconds else 0.0


def _np_dtype(name):
    from nki_kernels.registry import DTYPES
    return np.dtype(DTYPES[name])


def _kv_bytes(tokens, cfg):
    return tokens * 2 * cfg.kv_heads * cfg.head_dim * _np_dtype(cfg.dtype).itemsize


def replay(cfg: ServeConfig = ServeConfig(), target: str = "trn2", check=True,
           overrides=None) -> ServeTrace:
    from nki_kernels import simulate
    from nki_kernels.paged_attention import batch_decode, batch_decode_kernel, batch_decode_ref
    from nki_kernels.paged_kv_append import paged_kv_scatter_kernel
    from nki_kernels.paged_kv_append.page_table import PagedKVCache
    from nki_kernels.profile.cost_model import estimate
    from nki_kernels.profile.sensitivity import band

    rng = np.random.default_rng(cfg.seed)
    H, HQ, D = cfg.kv_heads, cfg.kv_heads * cfg.group, cfg.head_dim
    dt = _np_dtype(cfg.dtype)
    cache = PagedKVCache(cfg.pages, cfg.page_size, H, D, dtype=dt)
    kernels = (paged_kv_scatter_kernel, batch_decode_kernel)
    simulate.reset_compile_stats()
    out = ServeTrace(cfg, target, overrides=dict(overrides or {}))
    remaining, next_id, prompt_left = {}, 0, {}
    for step in range(cfg.steps):
        arrivals = rng.poisson(cfg.arrival_per_step) if step else max(1, cfg.max_batch // 2)
        new = []
        for _ in range(min(arrivals, cfg.max_batch - len(remaining))):
            cache.add_request(next_id)
            remaining[next_id] = int(rng.integers(*cfg.output_lens))
            new.append((next_id, int(rng.integers(*cfg.prompt_lens))))
            next_id += 1
        rids = sorted(remaining)
        if not rids:
            continue
        if cfg.prefill_chunk:
            prompt_left.update(new)
            out.steps.append(_mixed_step(step, cfg, target, cache, rids, prompt_left, rng, out,
                                         check))
            for r in rids:
                if prompt_left[r] == 0:          # the step produced this request's next token
                    remaining[r] -= 1
                    if remaining[r] == 0:
                        del remaining[r], prompt_left[r]
                        cache.free_request(r)
            continue
        before = sum(simulate.compile_stats(k)["compilations"] for k in kernels)
        with simulate.use_target(target), simulate.tracing() as traces:
            prompts = [n for _, n in new]
            if new:          # prefill: the prompts' K/V appended in one launch
                t = sum(prompts)
                cache.append([r for r, _ in new], *_kv(rng, t, H, D, dt), prompts, lnc=cfg.lnc)
            cache.append(rids, *_kv(rng, len(rids), H, D, dt), [1] * len(rids), lnc=cfg.lnc)
            q = rng.standard_normal((len(rids), HQ, D)).astype(dt)
            table = cache.page_table(rids)
            o = batch_decode(q, cache.data, *table, lnc=cfg.lnc)
        if check:
            ref = batch_decode_ref(q, cache.data, *table)
            err = np.abs(o.astype(np.float64) - ref.astype(np.float64)).max()
            out.max_error = max(out.max_error, float(err))
        decode = traces[-1]
        kv_tokens = sum(cache.seq_len(r) for r in rids)
        appended = sum(prompts) + len(rids)
        costs = [estimate(t, target, **out.overrides) for t in traces]
        out.steps.append(StepRecord(
            step, len(rids), appended, kv_tokens,
            sum(simulate.compile_stats(k)["compilations"] for k in kernels) - before,
            decode.program_instructions, sum(len(t) for t in traces),
            sum(c.seconds for c in costs), sum(t.hbm_bytes for t in traces),
            _kv_bytes(kv_tokens, cfg) + 2 * _kv_bytes(appended, cfg) + 2 * q.nbytes))
        rec = out.steps[-1]
        rec.static_chunks, rec.static_pass = _static_pass(q, cache.data, table, cfg.lnc, target)
        rec.floor_seconds = attention_floor(costs[-1].hw, rec.min_hbm_bytes,
                                            kv_tokens * cfg.kv_heads * cfg.group, cfg.head_dim,
                                            costs[-1].cores).seconds
        rec.band_seconds = band(list(traces), target, 1.0, out.overrides)
        for r in rids:
            remaining[r] -= 1
            if remaining[r] == 0:
                del remaining[r]
                cache.free_request(r)
    if cfg.prefill_chunk:
        kernels = _mixed_kernels()
    out.compilations = {simulate.compile_stats(k)["kernel"]: simulate.compile_stats(k)["compilations"]
                        for k in kernels}
    return out


def _mixed_kernels():
    """A chunked-prefill step's launches: the longer requests with the fused write, then the
    single-token ones as decode (``batch_prefill`` splits a mixed batch)."""
    from nki_kernels.paged_attention.kernel import (append_attention_kernel,
                                                           batch_decode_kernel)
    return append_attention_kernel, batch_decode_kernel


def _mixed_step(step, cfg, target, cache, rids, prompt_left, rng, out, check):
    """One chunked-prefill step: request r feeds min(prompt left, chunk) prompt tokens, or one
    decode token; one ``batch_prefill`` launch writes every new token's K/V and attends causally.
    Checked against the reference append and attention over the cache as it was before."""
    from nki_kernels import simulate
    from nki_kernels.paged_attention import batch_prefill, batch_prefill_ref
    from nki_kernels.paged_attention.work import causal_pairs
    from nki_kernels.paged_kv_append import append_paged_kv_cache_ref, get_batch_indices_positions
    from nki_kernels.profile.cost_model import estimate
    from nki_kernels.profile.sensitivity import band
    H, HQ, D = cfg.kv_heads, cfg.kv_heads * cfg.group, cfg.head_dim
    dt = _np_dtype(cfg.dtype)
    counts = [min(prompt_left[r], cfg.prefill_chunk) if prompt_left[r] else 1 for r in rids]
    cache.reserve(rids, counts)
    table = cache.page_table(rids)
    qo = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    Q = int(qo[-1])
    q = rng.standard_normal((Q, HQ, D)).astype(dt)
    k, v = _kv(rng, Q, H, D, dt)
    before_cache = cache.data.copy() if check else None
    kernels = _mixed_kernels()
    before = sum(simulate.compile_stats(x)["compilations"] for x in kernels)
    with simulate.use_target(target), simulate.tracing() as traces:
        o = batch_prefill(q, cache.data, qo, *table, causal=True, append_key=k, append_value=v,
                          lnc=cfg.lnc)
    kv_lens = np.array([cache.seq_len(r) for r in rids], np.int32)
    if check:
        batch, pos = get_batch_indices_positions(qo, kv_lens, Q)
        want = append_paged_kv_cache_ref(k, v, batch, pos, before_cache, table[1], table[0],
                                         table[2])
        if not np.array_equal(want, cache.data, equal_nan=True):
            raise AssertionError(f"step {step}: the fused write differs from the reference append")
        ref = batch_prefill_ref(q, want, qo, *table, causal=True)
        out.max_error = max(out.max_error, float(np.abs(o.astype(np.float64) - ref).max()))
    for r, n in zip(rids, counts):
        prompt_left[r] = max(0, prompt_left[r] - n)
    costs = [estimate(t, target, **out.overrides) for t in traces]
    cost = costs[-1]
    kv_tokens = int(kv_lens.sum())
    visible = causal_pairs(counts, kv_lens)
    min_bytes = _kv_bytes(kv_tokens, cfg) + 2 * _kv_bytes(Q, cfg) + 2 * q.nbytes
    floor = attention_floor(cost.hw, min_bytes, visible * HQ, D, cost.cores).seconds
    return StepRecord(step, len(rids), Q, kv_tokens,
                      sum(simulate.compile_stats(x)["compilations"] for x in kernels) - before,
                      max(t.program_instructions for t in traces), sum(len(t) for t in traces),
                      sum(c.seconds for c in costs), sum(t.hbm_bytes for t in traces), min_bytes,
                      floor, band(list(traces), target, 1.0, out.overrides))


def _kv(rng, tokens, H, D, dtype):
    return (rng.standard_normal((tokens, H, D)).astype(dtype),
            rng.standard_normal((tokens, H, D)).astype(dtype))


def trace_ratio(steps) -> str:
    """A trace's modelled time over its floor, each summed over the steps (the measure of a
    trace: a long step weighs as much as it costs), with the band of the uncertain constants."""
    steps = [x for x in steps if x.floor_seconds]
    floor = sum(x.floor_seconds for x in steps)
    if not floor:
        return "n/a"
    total = sum(x.seconds for x in steps)
    low = sum(x.band_seconds[0] for x in steps)
    high = sum(x.band_seconds[1] for x in steps)
    return f"{total / floor:.2f} ({low / floor:.2f}-{high / floor:.2f})"


def summary_markdown(trace: ServeTrace) -> str:
    s = trace.steps
    total = sum(x.seconds for x in s)
    hbm, floor = sum(x.hbm_bytes for x in s), sum(x.min_hbm_bytes for x in s)
    cfg = trace.config
    rows = [
        ("target", f"{trace.target}, LNC={cfg.lnc}"),
        ("model shape", f"{cfg.kv_heads} kv heads x {cfg.group} (GQA), head_dim {cfg.head_dim}, "
                        f"{cfg.dtype}, pages {cfg.pages} x {cfg.page_size} tokens"),
        ("scheduler", f"chunked prefill, {cfg.prefill_chunk} prompt tokens per request per step, "
                      "mixed with decode in one batch (two launches: the chunks with the fused "
                      "write, then decode)" if cfg.prefill_chunk else
                      "prompt K/V appended on arrival, then decode"),
        ("tokens fed per step (mean / max)", f"{np.mean([x.appended for x in s]):.0f} / "
                                             f"{max(x.appended for x in s)}"),
        ("steps replayed", len(s)),
        ("batch (min / mean / max)", f"{min(x.batch for x in s)} / "
                                     f"{np.mean([x.batch for x in s]):.1f} / {max(x.batch for x in s)}"),
        ("KV tokens attended per step (mean / max)", f"{np.mean([x.kv_tokens for x in s]):.0f} / "
                                                     f"{max(x.kv_tokens for x in s)}"),
        ("compilations", ", ".join(f"{k} {v}" for k, v in trace.compilations.items())),
        ("steps that compiled", sum(1 for x in s if x.compiles)),
        ("decode program instructions (max)", max(x.program_instructions for x in s)),
        ("executed instructions per step (mean)", f"{np.mean([x.executed_instructions for x in s]):.0f}"),
        ("modelled time per step (mean / max)", f"{1e6 * total / len(s):.1f} / "
                                                f"{1e6 * max(x.seconds for x in s):.1f} us"),
        ("HBM bytes / minimum", f"{hbm / floor:.3f}"),
        ("modelled time / floor (the trace's total over its floor's; band over the uncertain "
         "constants)", trace_ratio(s)),
        ("modelled time / floor (mean of the steps' ratios)",
         f"{np.mean([x.seconds / x.floor_seconds for x in s if x.floor_seconds]):.2f}"),
        ("decode tokens per second (modelled)", f"{trace.tokens_per_second:,.0f}"),
        ("max |out - reference|", f"{trace.max_error:.2e}"),
    ]
    return "| measure | value |\n|---|---|\n" + "\n".join(f"| {k} | {v} |" for k, v in rows)


def plot_steps(trace: ServeTrace, path: str) -> None:
    """Modelled time per step (and the batch) as a PNG (matplotlib, imported here only)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(9, 3.2))
    steps = [x.step for x in trace.steps]
    ax.plot(steps, [1e6 * x.seconds for x in trace.steps], label="modelled time (us)")
    compiled = [x for x in trace.steps if x.compiles]
    ax.scatter([x.step for x in compiled], [1e6 * x.seconds for x in compiled], color="red",
               zorder=3, label="step that compiled a new bucket")
    ax.set_xlabel("decode step")
    ax.set_ylabel("us per step (append + decode)")
    twin = ax.twinx()
    twin.step(steps, [x.batch for x in trace.steps], color="gray", alpha=0.5, where="mid")
    twin.set_ylabel("batch", color="gray")
    ax.plot(steps, [1e6 * x.floor_seconds for x in trace.steps], color="green", lw=0.8,
            ls="--", label="floor (bytes, FLOPs, elementwise passes)")
    ax.legend(loc="upper left", fontsize=8)
    ax.set_title(f"continuous-batching replay on {trace.target}, LNC={trace.config.lnc} "
                 f"(simulated, cost-modelled)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
