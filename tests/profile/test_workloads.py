"""The workload suite's step model: a small decode and a small mixed step, floors below the
modelled times, the mixed step's two launches counted."""

import pytest

from .benchmark_scripts import load


def _suite():
    return load("workloads")


def test_small_steps_are_modelled_above_their_floor():
    suite = _suite()
    decode = suite.run_case("paged_decode_attention", dict(batch=2, kv_len=64), "trn2")
    assert decode["launches"] == 1 and decode["us"] > decode["floor_us"] > 0
    assert decode["ratio"] == pytest.approx(decode["us"] / decode["floor_us"])
    mixed = suite.run_case("paged_prefill_attention",
                           dict(batch=2, q_len=1, kv_len=40, prefill=8, prefill_kv=40), "trn1")
    assert mixed["launches"] == 2 and mixed["ratio"] > 1
    table = suite.markdown([dict(workload="w", target="trn2", **decode)])
    assert table.splitlines()[2].startswith("| w | trn2 | 1 (")
    assert decode["bound"] == "bytes" and len(decode["terms"].split(" / ")) == 4


def test_a_spread_batch_draws_its_lengths_in_its_range():
    import numpy as np
    from nki_kernels.registry import KERNELS
    sizes = dict(batch=16, kv_len=300, kv_min=100, page_size=16, kv_heads=2, group=2, head_dim=32)
    case = KERNELS["paged_decode_attention"].make(sizes, np.random.default_rng(0))
    pages = np.diff(case["kv_indptr"])
    lens = (pages - 1) * 16 + case["kv_last_page_len"]
    assert lens.min() >= 100 and lens.max() <= 300 and len(set(lens.tolist())) > 4
    names = [w for w, _, _ in _suite().SUITE]
    assert any("spread" in w for w in names)
