"""``nki-kernels validate --device trn``: every kernel run on the device against its NumPy
reference, at small (demo) and realistic (bench) sizes, in fp32 and bf16, each layout, LNC=1 and
(trn2) LNC=2, the block-table entries; then a short serving replay (paged append + decode,
requests arriving and leaving) checked step by step. Prints a pass/fail table with the largest
error per dtype."""

from __future__ import annotations

import time

import numpy as np

from nki_kernels.registry import KERNELS, compare

LNC_KERNELS = ("paged_kv_append", "paged_decode_attention", "paged_prefill_attention",
               "paged_tree_verification")


def cases(target, quick):
    """(label, kernel, sizes, lnc) of the validation."""
    out = []
    for name, spec in KERNELS.items():
        size_sets = [("small", dict(spec.demo))] + ([] if quick else
                                                    [("realistic", dict(spec.bench))])
        for label, sizes in size_sets:
            variants = spec.variants if name != "tensor_scatter" else ({},)
            for variant in variants:
                for dtype in ("float32", "bfloat16"):
                    s = dict(sizes, **variant, dtype=dtype)
                    lncs = (1, 2) if target == "trn2" and name in LNC_KERNELS else (1,)
                    for lnc in lncs:
                        out.append((label, name, s, lnc))
    return out


def run_case(name, sizes, lnc=1):
    """(ok, max error) of one kernel at ``sizes`` against its reference; the reference takes
    inputs of its own (in-place kernels write theirs)."""
    spec = KERNELS[name]
    inputs = spec.make(sizes, np.random.default_rng(0))
    ref = spec.ref(spec.make(sizes, np.random.default_rng(0)))
    if lnc > 1:
        inputs["lnc"] = lnc
    out = spec.run(inputs)
    return compare(spec, inputs, out, ref)


def block_table_case(rng):
    """The vLLM-style entries: append by slot tables, then attention by block tables."""
    from nki_kernels.block_tables import (append_kv_with_block_tables,
                                          append_kv_with_block_tables_ref,
                                          attention_with_block_tables,
                                          attention_with_block_tables_ref)
    P, H, G, D, blocks = 16, 2, 4, 64, 24
    cache = rng.standard_normal((2, blocks, H, P, D)).astype(np.float32)
    seq_lens = np.array([37, 5, 60], np.int32)
    new = np.array([3, 1, 7], np.int32)
    table = rng.permutation(blocks)[:12].reshape(3, 4).astype(np.int32)
    qsl = np.concatenate([[0], np.cumsum(new)]).astype(np.int32)
    key = rng.standard_normal((int(new.sum()), H, D)).astype(np.float32)
    value = rng.standard_normal((int(new.sum()), H, D)).astype(np.float32)
    want = append_kv_with_block_tables_ref(key, value, cache, table, seq_lens, qsl)
    append_kv_with_block_tables(key, value, cache, table, seq_lens, qsl)
    ok = np.array_equal(cache, want)
    q = rng.standard_normal((int(new.sum()), H * G, D)).astype(np.float32)
    out = attention_with_block_tables(q, cache, table, seq_lens, qsl)
    ref = attention_with_block_tables_ref(q, cache, table, seq_lens, qsl)
    err = float(np.abs(out - ref).max())
    return ok and err <= 2e-5, err


def fused_write_case(rng, layout, lnc):
    """batch_prefill with the fused K/V write (a mixed batch): the cache ends as the reference
    append leaves it, the output is the reference attention over it."""
    from nki_kernels.paged_attention import batch_prefill, batch_prefill_ref
    from nki_kernels.paged_kv_append import append_paged_kv_cache_ref, get_batch_indices_positions
    P, H, G, D = 16, 2, 4, 64
    q_lens, kv_lens = np.array([5, 1, 40]), np.array([70, 33, 200])
    pages = -(-kv_lens // P)
    n = int(pages.sum()) + 2
    inner = (P, H, D) if layout == "NHD" else (H, P, D)
    cache = rng.standard_normal((n, 2) + inner).astype(np.float32)
    kv_indptr = np.concatenate([[0], np.cumsum(pages)]).astype(np.int32)
    kv_indices = rng.permutation(n)[:kv_indptr[-1]].astype(np.int32)
    last = ((kv_lens - 1) % P + 1).astype(np.int32)
    qo = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    q = rng.standard_normal((int(qo[-1]), H * G, D)).astype(np.float32)
    key, value = (rng.standard_normal((int(qo[-1]), H, D)).astype(np.float32) for _ in range(2))
    batch, pos = get_batch_indices_positions(qo, kv_lens.astype(np.int32), int(qo[-1]))
    want = append_paged_kv_cache_ref(key, value, batch, pos, cache, kv_indices, kv_indptr, last,
                                     layout)
    out = batch_prefill(q, cache, qo, kv_indptr, kv_indices, last, layout, causal=True, lnc=lnc,
                        append_key=key, append_value=value)
    ref = batch_prefill_ref(q, want, qo, kv_indptr, kv_indices, last, layout, causal=True)
    err = float(np.abs(out - ref).max())
    return bool(np.array_equal(cache, want)) and err <= 2e-5, err


def serving_replay(steps=8, rng=None, log=print):
    """Requests arriving and finishing over ``steps`` decode steps (PagedKVCache append +
    batch_decode), each step's output checked against the reference; returns (ok, max error)."""
    from nki_kernels.paged_attention import batch_decode, batch_decode_ref
    from nki_kernels.paged_kv_append.page_table import PagedKVCache
    rng = rng or np.random.default_rng(0)
    H, G, D, P = 2, 4, 64, 16
    cache = PagedKVCache(64, P, H, D, dtype=np.float32)
    live, next_id, worst = {}, 0, 0.0
    for step in range(steps):
        arrivals = 2 if step in (0, 3) else 0
        new = []
        for _ in range(arrivals):
            cache.add_request(next_id)
            live[next_id] = int(rng.integers(2, 6))
            new.append((next_id, int(rng.integers(5, 70))))
            next_id += 1
        rids = sorted(live)
        if not rids:
            continue
        if new:
            n = sum(p for _, p in new)
            cache.append([r for r, _ in new], *(rng.standard_normal((n, H, D)).astype(np.float32)
                                                for _ in range(2)), [p for _, p in new])
        cache.append(rids, *(rng.standard_normal((len(rids), H, D)).astype(np.float32)
                             for _ in range(2)), [1] * len(rids))
        q = rng.standard_normal((len(rids), H * G, D)).astype(np.float32)
        table = cache.page_table(rids)
        err = float(np.abs(batch_decode(q, cache.data, *table).astype(np.float64)
                           - batch_decode_ref(q, cache.data, *table)).max())
        worst = max(worst, err)
        log(f"  serving step {step}: {len(rids)} requests, max error {err:.2e}")
        for r in rids:
            live[r] -= 1
            if live[r] == 0:
                del live[r]
                cache.free_request(r)
    return worst <= 2e-5, worst


def validate(target, quick=False, log=print):
    """Run everything; returns (all ok, table markdown)."""
    rows, worst = [], {}
    for label, name, sizes, lnc in cases(target, quick):
        t0 = time.perf_counter()
        try:
            ok, err = run_case(name, sizes, lnc)
            note = ""
        except Exception as exc:                     # a failure is a row, not the end
            ok, err, note = False, float("nan"), f"{type(exc).__name__}: {exc}"[:120]
        dtype = sizes["dtype"]
        worst[dtype] = max(worst.get(dtype, 0.0), err if err == err else float("inf"))
        extra = ", ".join(f"{k}={v}" for k, v in sizes.items() if k == "layout")
        rows.append((name, label, dtype, extra, lnc, ok, err, note))
        log(f"[{name} {label} {dtype}{' ' + extra if extra else ''} lnc={lnc}] "
            f"{'PASS' if ok else 'FAIL'} max error {err:.2e} ({time.perf_counter() - t0:.1f} s)"
            + (f" {note}" if note else ""))
    for layout in ("NHD", "HND"):
        for lnc in ((1, 2) if target == "trn2" else (1,)):
            ok, err = fused_write_case(np.random.default_rng(2), layout, lnc)
            rows.append(("prefill with the fused write", "small", "float32", layout, lnc, ok,
                         err, ""))
            log(f"[prefill + fused write {layout} lnc={lnc}] {'PASS' if ok else 'FAIL'} "
                f"max error {err:.2e}")
    ok, err = block_table_case(np.random.default_rng(1))
    rows.append(("block tables (append + attention)", "small", "float32", "HND", 1, ok, err, ""))
    log(f"[block tables] {'PASS' if ok else 'FAIL'} max error {err:.2e}")
    replay_ok, replay_err = serving_replay(log=log)
    rows.append(("serving replay (8 steps)", "small", "float32", "NHD", 1, replay_ok,
                 replay_err, ""))
    lines = ["| kernel | sizes | dtype | layout | LNC | result | max error | note |",
             "|" + "---|" * 8]
    for name, label, dtype, extra, lnc, ok_, e, note in rows:
        lines.append(f"| {name} | {label} | {dtype} | {extra or '-'} | {lnc} | "
                     f"{'pass' if ok_ else 'FAIL'} | {e:.2e} | {note} |")
    lines.append("")
    lines.append("largest error per dtype: " + ", ".join(f"{k} {v:.2e}" for k, v in worst.items()))
    return all(r[5] for r in rows), "\n".join(lines)
