"""The sensitivity table moves the same figure the benchmark table reports: for a step of two
launches (a mixed prefill batch: the chunk, then decode), the base ratio is the sum of both."""

import pytest

from nki_kernels.cli import check, cost_row
from nki_kernels.profile.sensitivity import sensitivity


def test_base_ratio_is_the_table_ratio_for_two_launches():
    sizes = dict(batch=3, q_len=1, prefill=40, prefill_kv=1200, kv_len=300, page_size=16,
                 kv_heads=2, group=4, head_dim=64, dtype="float32")
    row = check("paged_prefill_attention", sizes, "trn2", log=lambda *a: None)
    assert len(row["traces"]) == 2
    table, _ = cost_row(row)
    moves = sensitivity(row["traces"], "trn2", table["floor_us"] * 1e-6)
    assert moves["base"][0] == pytest.approx(table["vs_floor"])
    half, double = moves["loop_iteration_s"]
    assert half < moves["base"][0] < double            # the prefill launch loops on the device
    alone = sensitivity(row["traces"][-1], "trn2", table["floor_us"] * 1e-6)["base"][0]
    assert alone < moves["base"][0]                    # the last launch alone is less
