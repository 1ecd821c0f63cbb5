"""Stateful fuzzing of ``PagedKVCache``: requests join, append, get truncated and leave in random
order against a plain model (each request's list of K/V rows); appends that run out of pages,
are malformed, or fail inside the kernel launch with any exception change nothing."""

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (Bundle, RuleBasedStateMachine, consumes, initialize, invariant,
                                 rule, run_state_machine_as_test)

from nki_kernels import simulate
from nki_kernels.paged_kv_append import OutOfPages, PagedKVCache
from nki_kernels.paged_kv_append import page_table as page_table_module

from .cases import BUDGETS, TARGETS

N, P, H, D = 7, 3, 2, 2


class Boom(Exception):
    """A failure of no particular kind inside the kernel launch."""


class CacheMachine(RuleBasedStateMachine):
    requests = Bundle("requests")

    def __init__(self):
        super().__init__()
        self.next_id = 0
        self.model = {}               # rid -> list of (k [H, D], v [H, D])
        self.rng = np.random.default_rng(0)

    @initialize(target_name=st.sampled_from(TARGETS), layout=st.sampled_from(["NHD", "HND"]),
                fused=st.booleans())
    def make(self, target_name, layout, fused):
        self.target = target_name
        self.cache = PagedKVCache(N, P, H, D, kv_layout=layout, fused=fused, fill=np.nan)

    @rule(target=requests)
    def add(self):
        rid = f"r{self.next_id}"
        self.next_id += 1
        self.cache.add_request(rid)
        self.model[rid] = []
        return rid

    @rule(rids=st.lists(requests, min_size=1, max_size=3, unique=True),
          counts=st.lists(st.integers(0, 5), min_size=3, max_size=3),
          failure=st.sampled_from([None, None, None, "kernel", "keyboard", "shape", "lens"]))
    def append(self, rids, counts, failure):
        rids = [r for r in rids if r in self.model]
        if not rids:
            return
        counts = counts[:len(rids)]
        total = sum(counts)
        keys = self.rng.standard_normal((total, H, D)).astype(np.float32)
        values = self.rng.standard_normal((total, H, D)).astype(np.float32)
        before = self._state()
        need = sum(max(0, -(-(len(self.model[r]) + n) // P) - len(self.cache.pages(r)))
                   for r, n in zip(rids, counts))
        expected = None
        if failure == "shape":
            keys = keys[:, :, :1]
            expected = ValueError
        elif failure == "lens":
            counts = counts + [1]
            expected = ValueError
        elif need > self.cache.num_free_pages:
            expected = OutOfPages
        elif failure in ("kernel", "keyboard"):
            expected = Boom if failure == "kernel" else KeyboardInterrupt
        original = page_table_module.append_paged_kv_cache

        def failing(*args, **kwargs):
            raise expected("injected")

        if failure in ("kernel", "keyboard") and expected is not OutOfPages:
            page_table_module.append_paged_kv_cache = failing
        try:
            with simulate.use_target(self.target):
                if expected is None:
                    self.cache.append(rids, keys, values, counts)
                else:
                    with pytest.raises(expected):
                        self.cache.append(rids, keys, values, counts)
        finally:
            page_table_module.append_paged_kv_cache = original
        if expected is not None:
            assert self._state() == before, f"{failure or 'out of pages'}: state changed"
            return
        row = 0
        for r, n in zip(rids, counts):
            self.model[r].extend(zip(keys[row:row + n], values[row:row + n]))
            row += n

    @rule(rid=consumes(requests))
    def free(self, rid):
        self.cache.free_request(rid)
        del self.model[rid]

    @rule(rid=requests, keep=st.integers(0, 20))
    def truncate(self, rid, keep):
        if rid not in self.model:
            return
        if keep > len(self.model[rid]):
            with pytest.raises(ValueError, match="new_len"):
                self.cache.truncate(rid, keep)
            return
        self.cache.truncate(rid, keep)
        del self.model[rid][keep:]

    @rule(rid=st.text(min_size=1, max_size=3))
    def unknown_request_is_a_key_error(self, rid):
        if rid in self.model:
            return
        with pytest.raises(KeyError, match="not in the cache"):
            self.cache.free_request(rid)

    def _state(self):
        data = self.cache.data
        raw = data.tobytes() if isinstance(data, np.ndarray) else b"".join(a.tobytes() for a in data)
        return ({r: (self.cache.seq_len(r), tuple(self.cache.pages(r))) for r in self.model},
                sorted(self.cache._free), raw)

    @invariant()
    def pages_are_owned_once_and_rows_hold_what_was_appended(self):
        if not hasattr(self, "cache"):
            return
        owned = [p for r in self.model for p in self.cache.pages(r)]
        assert len(owned) == len(set(owned))
        assert sorted(owned + self.cache._free) == list(range(N))
        data = self.cache.data
        k_all, v_all = (data[:, 0], data[:, 1]) if isinstance(data, np.ndarray) else data
        for r, rows in self.model.items():
            assert self.cache.seq_len(r) == len(rows)
            pages = self.cache.pages(r)
            assert len(pages) == -(-len(rows) // P)
            for pos, (k, v) in enumerate(rows):
                page, entry = pages[pos // P], pos % P
                if self.cache.kv_layout == "NHD":
                    got_k, got_v = k_all[page, entry], v_all[page, entry]
                else:
                    got_k, got_v = k_all[page, :, entry], v_all[page, :, entry]
                assert np.array_equal(got_k, k) and np.array_equal(got_v, v), (r, pos)


@pytest.mark.parametrize("budget", BUDGETS)
def test_paged_kv_cache_operations_are_all_or_nothing(budget):
    run_state_machine_as_test(CacheMachine, settings=settings(
        max_examples=25 * budget, stateful_step_count=12, deadline=None,
        derandomize=budget == 1, database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much]))
