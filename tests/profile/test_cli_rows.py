"""The CLI's cost rows cover every launch of a call (a mixed batch is two launches)."""

import pytest

from nki_kernels.cli import check, cost_row
from nki_kernels.profile import estimate

pytestmark = pytest.mark.sim_only


def test_a_mixed_batch_is_costed_over_both_launches():
    sizes = dict(batch=3, q_len=1, kv_len=300, page_size=16, kv_heads=2, group=4, head_dim=64,
                 prefill=70, prefill_kv=200)
    row = check("paged_prefill_attention", sizes, "trn2", log=lambda *_: None)
    assert row["ok"] and len(row["traces"]) == 2           # the chunk, then the decode requests
    table, _ = cost_row(row)
    parts = [estimate(t, target="trn2") for t in row["traces"]]
    assert table["est_us"] == pytest.approx(sum(e.seconds for e in parts) * 1e6)
    assert table["hbm_bytes"] == sum(e.hbm_bytes for e in parts)
    kv_bytes = (3 * 300 + 200) * 2 * 2 * 64 * 4              # every key read once, fp32
    assert table["hbm_bytes"] >= kv_bytes
