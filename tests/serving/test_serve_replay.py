"""The continuous-batching replay: every step matches the reference, and the kernels compile at
most once per shape bucket the trace touches."""

import json

import pytest

from nki_kernels.buckets import bucket
from nki_kernels.cli import main
from nki_kernels.paged_attention.work import (WHOLE_UNIT_SPAN_COLS, items_per_iteration,
                                                    span_cols)
from nki_kernels.serve import ServeConfig, replay, summary_markdown

pytestmark = pytest.mark.sim_only


@pytest.mark.parametrize("target", ["trn1", "trn2"])
def test_replay_compiles_once_per_bucket(target):
    trace = replay(ServeConfig(steps=14, max_batch=6, prompt_lens=(5, 300), seed=3), target)
    assert trace.max_error < 1e-5
    # one compile per batch bucket, and per chunk count (and sections) of a small bucket's
    # static pass
    keys = {(bucket(s.batch), s.static_pass) for s in trace.steps}
    assert trace.compilations["batch_decode_kernel"] == len(keys)
    # append launches: prefill launches (prompt sums) and decode appends (one per request)
    assert trace.compilations["paged_kv_scatter_kernel"] <= 2 * len(trace.steps)
    # (a static pass's sections, work.static_sections, add two variants late in this trace: 3,
    # against 1 in one section; 5 decode compiles in all against 3)
    assert sum(s.compiles for s in trace.steps[len(trace.steps) // 2:]) <= 3
    # the program holds a fixed number of item bodies whatever the lengths: one per kind of work
    # item and loop width (the measured size is a lower bound: a loop that did not run in the
    # first iteration is not counted)
    assert max(s.program_instructions for s in trace.steps) < 1000
    # each work item (2-3 per request here) also loads and stores its request's fp32 softmax
    # state ([rows, D + 2], 2 x 2 KiB in this tiny model of 2 kv heads x 64): up to 15% of these
    # ~150-token requests' bytes (a 32-block of a Llama-8B layer: 0.2%); trn1 also reads whole
    # pages (P = 16): a partly filled last page costs up to 15 tokens per request, about 9% more;
    # null items padding a loop iteration read their table rows (64 B on each of 128 partitions:
    # up to 3% here, 0.4% at 16 items of a Llama-8B layer)
    limit = 1.20 if target == "trn2" else 1.23
    assert all(1.0 <= s.hbm_bytes / s.min_hbm_bytes < limit for s in trace.steps)
    assert "compilations" in summary_markdown(trace)


def test_cli_serve_writes_table_and_json(tmp_path, capsys):
    assert main(["serve", "--steps", "4", "--max-batch", "3", "--out", str(tmp_path)]) == 0
    assert "decode tokens per second" in capsys.readouterr().out
    data = json.loads((tmp_path / "serve_small_trn2_lnc1.json").read_text())
    assert len(data["steps"]) == 4 and data["compilations"]["batch_decode_kernel"] >= 1


def test_lnc2_replay_shares_steps_over_two_cores():
    one = replay(ServeConfig(steps=10, max_batch=5, prompt_lens=(5, 300), seed=4), "trn2")
    two = replay(ServeConfig(steps=10, max_batch=5, prompt_lens=(5, 300), seed=4, lnc=2), "trn2")
    assert two.max_error < 1e-5
    # LNC=2 adds no compile keys per bucket (and chunk count of a static pass)
    keys = {(bucket(s.batch), s.static_pass) for s in two.steps}
    assert two.compilations["batch_decode_kernel"] == len(keys)
    for a, b in zip(one.steps, two.steps):
        if a.static_chunks == b.static_chunks == 0:
            # looped on both: the same K/V bytes, shared; each core also reads its own tables
            # and the split request's q, and each work item loads and stores its request's fp32
            # softmax state and writes its output row (up to 6% over one core, 15% over the
            # minimum, at these ~400-token steps of a tiny model)
            assert a.hbm_bytes <= b.hbm_bytes <= 1.06 * a.hbm_bytes
        assert b.hbm_bytes < 1.20 * b.min_hbm_bytes
        assert b.floor_seconds == pytest.approx(a.floor_seconds / 2)
        # the second core helps, or (a static pass of one row) stays idle
        assert b.seconds < a.seconds or (b.static_chunks and b.batch == 1
                                         and b.seconds == pytest.approx(a.seconds))


def test_cli_serve_refuses_lnc2_on_trn1():
    with pytest.raises(SystemExit, match="trn2"):
        main(["serve", "--steps", "2", "--lnc", "2", "--target", "trn1"])


@pytest.mark.parametrize("target", ["trn1", "trn2"])
def test_chunked_prefill_replay_mixes_prefill_and_decode(target):
    """prefill_chunk: prompts fed 48 tokens per step alongside other requests' decode tokens, one
    fused write + attention launch per step, each step checked (cache bytes against the reference
    append, outputs against the reference attention); every launch shape is a bucket."""
    from nki_kernels import simulate
    from nki_kernels.serve import _mixed_kernels
    trace = replay(ServeConfig(steps=14, max_batch=4, arrival_per_step=0.3, prompt_lens=(5, 200),
                               output_lens=(2, 12), seed=3, prefill_chunk=48), target)
    assert trace.max_error < 1e-5
    mixed = [s for s in trace.steps if s.appended > s.batch]
    assert mixed and len(mixed) < len(trace.steps)           # mixed steps and decode-only ones
    assert all(s.appended <= 48 * s.batch for s in trace.steps)
    keys = simulate.compile_keys(_mixed_kernels()[0])
    assert sum(trace.compilations.values()) == sum(s.compiles for s in trace.steps)
    assert trace.compilations["append_attention_kernel"] == len(keys)
    assert trace.compilations["batch_decode_kernel"] >= 1         # single-token requests
    for key in simulate.compile_keys(_mixed_kernels()[1]):     # decode launches: Qb = 1
        q_rows = key[0][0][1][0]
        assert q_rows == bucket(q_rows)
    from nki_kernels.paged_attention.plan import TAIL_PROFILE, STATIC_PASS, query_block
    config = ServeConfig()
    blocks = {query_block(n, config.group, config.kv_heads, config.head_dim) for n in range(1, 49)}
    for key in keys:
        shapes = [a[1] for a in key[0] if a[0] == "tensor"]
        q_rows, slot_rows, items, spans = shapes[0][0], shapes[2][0], shapes[6][0], shapes[7]
        # a small bucket's static pass (the statics end the key): a row each
        static = key[0][STATIC_PASS - TAIL_PROFILE - 1] != ("tuple",)
        if static:             # no loops: its spans are its token slots' cache rows
            assert items == q_rows and spans[0] == 128 and spans[1] % items == 0
            continue
        # single queries (Qb = 1, a flat list, eight items per loop iteration): a bucket of
        # requests; blocks of queries (whole units): a bucket of blocks of a size the planner
        # chooses
        flat = spans[1] == span_cols(items_per_iteration(1))
        assert flat or spans[1] == WHOLE_UNIT_SPAN_COLS
        if flat:
            assert q_rows == bucket(q_rows)
        else:
            assert any(q_rows % qb == 0 and q_rows // qb == bucket(q_rows // qb) for qb in blocks)
        assert items >= 8 * (q_rows // max(blocks) if not flat else q_rows)
        assert slot_rows == bucket(slot_rows) or slot_rows % 128 == 0
    assert sum(s.compiles for s in trace.steps[len(trace.steps) // 2:]) <= 2
    assert "chunked prefill, 48 prompt tokens" in summary_markdown(trace)
