"""benchmarks/peers.py's choice of steps and of the peer's length bucket (the peer itself needs
a checkout of nki-library; these parts do not)."""

import numpy as np

from tests.profile.benchmark_scripts import load

peers = load("peers")


def test_bucket_keeps_whole_tiles_else_next_power_of_two():
    assert peers.peer_bucket(4096) == 4096
    assert peers.peer_bucket(4352) == 4352          # 17 tiles of 256: each program whole tiles
    assert peers.peer_bucket(256) == 256
    assert peers.peer_bucket(800) == 1024
    assert peers.peer_bucket(1300) == 2048
    assert peers.peer_bucket(100) == 512            # never below 512
    assert peers.peer_bucket(2047) == 2048


def test_steps_are_the_suites_decode_and_chain_verification():
    names = [name for name, _, _ in peers.decode_steps()]
    assert "short chat decode 1 x 512" in names
    assert "short chat decode 32 x 64-2048 (spread)" in names
    assert "verify 16 x 4 drafts x 700-1300 (spread)" in names
    assert "shared prefix without cascade: decode 32 x 4352" in names
    for left_out in ("tree verify", "chunked prefill", "mixed", "cascade"):
        assert not any(name.startswith(left_out) for name in names), left_out
    assert len(peers.decode_steps(quick=True)) == 2


def test_step_lengths_are_the_suites_requests():
    keys, q_len = peers.step_lengths("paged_decode_attention", dict(batch=3, kv_len=520))
    assert q_len == 1 and keys.tolist() == [520, 520, 520]
    keys, q_len = peers.step_lengths("paged_prefill_attention",
                                     dict(batch=5, q_len=4, kv_len=1300, kv_min=700))
    assert q_len == 4 and keys.shape == (5,)
    assert (keys >= 700).all() and (keys <= 1300).all() and np.unique(keys).size > 1
