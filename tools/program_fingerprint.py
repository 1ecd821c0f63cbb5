"""Fingerprint the programs our kernels issue and their modelled times, to show a refactoring
changed neither: ``python3 tools/program_fingerprint.py > before.txt``, change, run again, diff.

Each line: case, target, instructions, a hash of the instruction stream (op, engine, program
id, operand buffers (HBM of either kind as one) / dtypes / shapes / patterns / offsets, sizes,
bytes, runs, FLOPs, loop depth) and the scheduled estimate in us.
"""

from __future__ import annotations

import hashlib
import sys

import numpy as np

from nki_kernels import simulate
from nki_kernels.profile import estimate


def stream_hash(trace) -> str:
    h = hashlib.sha256()
    for e in trace:
        ops = tuple((o.role, "hbm" if o.buffer.endswith("hbm") else o.buffer, o.dtype, o.shape,
                     o.pattern, o.offset, o.indirect) for o in e.operands)
        h.update(repr((e.op, e.engine, e.program_id, ops, e.partitions, e.free_elems,
                       e.dma_bytes, e.dma_runs, e.flops, e.loop_depth)).encode())
    return h.hexdigest()[:16]


def cases():
    """(name, callable) pairs; each callable launches once or more."""
    from nki_kernels.paged_kv_append import PagedKVCache
    from nki_kernels.paged_attention import batch_decode, batch_prefill
    from nki_kernels.tensor_scatter import tensor_scatter_

    def cache_case(layout, lens, H=2, D=64, P=16):
        rng = np.random.default_rng(0)
        cache = PagedKVCache(64, P, H, D, kv_layout=layout)
        rids = [str(i) for i in range(len(lens))]
        for r in rids:
            cache.add_request(r)
        k = rng.standard_normal((sum(lens), H, D)).astype(np.float32)
        cache.append(rids, k, -k, append_lens=lens)
        return cache, rids, rng

    def decode(layout, lnc=1, soft_cap=20.0):
        cache, rids, rng = cache_case(layout, [37, 130, 5])
        q = rng.standard_normal((3, 8, 64)).astype(np.float32)
        batch_decode(q, cache.data, *cache.page_table(rids), layout, window_left=100,
                     logits_soft_cap=soft_cap, lnc=lnc)

    def prefill(layout):
        cache, rids, rng = cache_case(layout, [300, 40])
        q = rng.standard_normal((45, 8, 64)).astype(np.float32)
        kv_indptr, kv_indices, last = cache.page_table(rids)
        batch_prefill(q, cache.data, np.array([0, 40, 45], np.int32), kv_indptr, kv_indices,
                      last, layout, causal=True)

    def mixed_write(layout):
        cache, rids, rng = cache_case(layout, [200, 40, 9])
        cache.reserve(rids, [3, 1, 1])
        q = rng.standard_normal((5, 8, 64)).astype(np.float32)
        new = rng.standard_normal((5, 2, 64)).astype(np.float32)
        kv_indptr, kv_indices, last = cache.page_table(rids)
        batch_prefill(q, cache.data, np.array([0, 3, 4, 5], np.int32), kv_indptr, kv_indices,
                      last, layout, causal=True, append_key=new, append_value=-new)

    def append(layout):
        cache_case(layout, [37, 130, 5])

    def scatter():
        past = np.zeros((4, 2, 300, 64), np.float32)
        tensor_scatter_(past, np.ones((4, 2, 3, 64), np.float32), np.array([0, 5, 297, 100]),
                        axis=2, mode="circular")

    return [("decode NHD", lambda: decode("NHD")), ("decode HND", lambda: decode("HND")),
            ("prefill NHD", lambda: prefill("NHD")), ("prefill HND", lambda: prefill("HND")),
            ("mixed fused write", lambda: mixed_write("NHD")), ("append HND", lambda: append("HND")),
            ("append NHD", lambda: append("NHD")), ("tensor_scatter", scatter),
            ("decode NHD lnc=2 (trn2)", lambda: decode("NHD", lnc=2)),
            ("decode NHD no cap", lambda: decode("NHD", soft_cap=0.0))]


def main() -> int:
    for target in ("trn1", "trn2"):
        for name, run in cases():
            if "lnc=2" in name and target == "trn1":
                continue
            with simulate.use_target(target), simulate.tracing() as traces:
                run()
            for i, trace in enumerate(traces):
                est = estimate(trace, target=target)
                print(f"{name} #{i} | {target} | {len(trace)} | {stream_hash(trace)} | "
                      f"{est.seconds * 1e6:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
