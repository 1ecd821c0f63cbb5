"""The torch ops refuse, before writing, a cache autograd tracks and arguments on other devices
(a meta-device index used to make the op run its fake and write nothing)."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import nki_kernels.torch as nt  # noqa: E402

from ..kernels.paged_kv_append.conftest import make_append_case  # noqa: E402


def _append_args(rng):
    args = make_append_case(rng, [20, 9], [4, 9], 8, 2, 4)
    return [torch.from_numpy(a) if isinstance(a, np.ndarray) else a for a in args]


def test_a_cache_that_requires_grad_is_not_written(rng):
    t = _append_args(rng)
    t[4] = torch.zeros_like(t[4]).requires_grad_(True)
    with pytest.raises(RuntimeError, match="kv_cache requires grad"):
        nt.append_paged_kv_cache(*t)
    assert not t[4].detach().any()


@pytest.mark.parametrize("which, name", [(5, "kv_indices"), (2, "batch_indices")])
def test_a_meta_index_with_a_cpu_cache_is_refused(rng, which, name):
    t = _append_args(rng)
    t[4] = torch.zeros_like(t[4])
    t[which] = t[which].to("meta")
    with pytest.raises(RuntimeError, match=f"{name} is on meta but kv_cache is on cpu"):
        nt.append_paged_kv_cache(*t)
    assert not t[4].any()


def test_decode_and_tensor_scatter_check_devices_too():
    q = torch.zeros(1, 4, 8)
    cache = torch.zeros(4, 2, 16, 2, 8)
    ip = torch.tensor([0, 1], dtype=torch.int32)
    with pytest.raises(RuntimeError, match="kv_indices is on meta"):
        nt.batch_decode(q, cache, ip, torch.zeros(1, dtype=torch.int32, device="meta"),
                        torch.tensor([3], dtype=torch.int32))
    with pytest.raises(RuntimeError, match="write_indices is on meta"):
        nt.tensor_scatter(torch.zeros(2, 1, 8, 4), torch.zeros(2, 1, 1, 4),
                          torch.zeros(2, dtype=torch.int64, device="meta"))
