"""The host-time benchmark times the entries up to the launch and no further: nothing runs on
the (simulated) device, the cache is not written, the entries' runners come back."""

from .benchmark_scripts import load


def _script():
    return load("host_time")


def test_host_time_stops_at_the_launch(monkeypatch):
    from nki_kernels.paged_attention import api
    script = _script()
    runners = (api.run_decode, api.run_prefill)
    stops = []

    def stop(*args, **kwargs):
        stops.append(len(args))
        raise script._Launched()
    monkeypatch.setattr(script, "_stop", stop)
    small = dict(batch=3, q_len=5, kv_len=40, kv_min=10)
    first, median, least = script.host_seconds("paged_prefill_attention", small, True, 2, 3)
    assert first > 0 and median >= least > 0
    assert len(stops) == 4                   # every call reached the launch, none went past
    assert (api.run_decode, api.run_prefill) == runners
    first, median, least = script.host_seconds("paged_decode_attention",
                                               dict(batch=2, kv_len=33), False, 1, 2)
    assert median >= least > 0 and len(stops) == 7


def test_the_cases_are_the_suites_kernels():
    from nki_kernels.registry import KERNELS
    for name, kernel, sizes, fused in _script().CASES:
        assert kernel in KERNELS and sizes["batch"] >= 1 and isinstance(fused, bool), name
