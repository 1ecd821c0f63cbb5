"""The Trainium path's tools on a CPU: launch recording, the SDK rules, the rehearsal's
benchmark stand-in, the fit, and the one-line refusals without an SDK."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from nki_kernels.device import fit as fitting
from nki_kernels.device.launches import DeviceNki, recording
from nki_kernels.device.rehearse import benchmark_with, hidden_constants
from nki_kernels.device.sdk import sdk_problem, version_tuple

pytestmark = pytest.mark.sim_only


class FakeModule:
    """An nki-like module: jit returns the function itself, a version."""
    __version__ = "0.6.1"

    @staticmethod
    def jit(fn):
        return fn

    answer = 42


def test_device_nki_records_launches_and_passes_the_rest_through():
    nki = DeviceNki(FakeModule())
    kernel = nki.jit(lambda a, b=1: a + b)
    assert nki.answer == 42
    with recording() as launches:
        assert kernel(2, b=3) == 5
    assert kernel(1) == 2                                    # no recorder: nothing noted
    assert len(launches) == 1 and launches[0].args == (2,) and launches[0].kwargs == {"b": 3}
    assert launches[0].grid is None


def test_sdk_rules_are_said_in_one_line():
    assert version_tuple("0.6.0.dev3") == (0, 6, 0) and version_tuple("2") == (2, 0, 0)
    assert sdk_problem("nki", FakeModule(), "trn2") is None
    old = type("Old", (), {"__version__": "0.3.1"})()
    assert "nl.fori_loop" in sdk_problem("nki", old, "trn2")
    assert "Trainium1" in sdk_problem("nki", FakeModule(), "trn1")
    assert sdk_problem("rehearsal", old, "trn1") is None
    assert "\n" not in sdk_problem("nki", FakeModule(), "trn1")


def test_hidden_constants_parse_and_refuse_unknown_names(monkeypatch):
    monkeypatch.setenv("NKI_KERNELS_REHEARSE_CONSTANTS", "swdge_cycles_per_descriptor=3,"
                                                          "dma_queues_in_flight=8")
    assert hidden_constants() == {"swdge_cycles_per_descriptor": 3.0, "dma_queues_in_flight": 8}
    assert isinstance(hidden_constants()["dma_queues_in_flight"], int)
    monkeypatch.setenv("NKI_KERNELS_REHEARSE_CONSTANTS", "warp_speed=9")
    with pytest.raises(ValueError, match="warp_speed"):
        hidden_constants()


def copy_kernel(a):
    """HBM -> SBUF -> HBM: two DMAs."""
    from nki_kernels.simulate import nisa, nl
    out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm, name="out")
    tile = nl.ndarray(a.shape, a.dtype, buffer=nl.sbuf, name="tile")
    nisa.dma_copy(dst=tile, src=a)
    nisa.dma_copy(dst=out, src=tile)
    return out


def test_rehearsal_benchmark_prices_under_hidden_constants(monkeypatch, tmp_path):
    """nki.benchmark's stand-in: compiles the function, runs it, reports the model's latency
    under the hidden constants in microseconds, writes the NEFF / NTFF stand-ins."""
    from nki_kernels import simulate
    from nki_kernels.profile import estimate
    jit = simulate.build_modules()["nki"].jit
    a = np.arange(128 * 64, dtype=np.float32).reshape(128, 64)
    monkeypatch.setenv("NKI_KERNELS_REHEARSE_CONSTANTS", "dma_descriptor_bytes=4000")
    monkeypatch.setenv("NKI_KERNELS_REHEARSE_TARGET", "trn2")
    bench = benchmark_with(jit)(warmup=2, iters=3, save_neff_name=str(tmp_path / "k.neff"),
                                save_trace_name=str(tmp_path / "k.ntff"))(copy_kernel)
    out = bench(a)
    np.testing.assert_array_equal(out, a)
    with simulate.use_target("trn2"), simulate.tracing() as traces:
        jit(copy_kernel)(a)
    want = estimate(traces[-1], target="trn2", dma_descriptor_bytes=4000).seconds * 1e6
    default = estimate(traces[-1], target="trn2").seconds * 1e6
    latency = bench.benchmark_result.nc_latency
    assert latency.get_latency_percentile(50) == pytest.approx(want)
    assert want != pytest.approx(default)
    assert json.loads((tmp_path / "k.ntff").read_text())["iters"] == 3
    assert (tmp_path / "k.neff").exists()


@pytest.mark.slow
def test_fit_recovers_a_hidden_constant_on_its_own_rows():
    """Rows 'measured' under loop_iteration_s = 4 us: the fit of that constant alone finds it
    (steps that run device loops: a static pass has no loop barrier to fit). Slow: eight
    samples of two launches' schedules, ~4 minutes (`.ci/run` runs tests/device with -m slow)."""
    rows = [dict(kernel="paged_decode_attention", sizes=dict(batch=2, kv_len=4500, page_size=16,
                                                             kv_heads=2, group=2, head_dim=32),
                 ok=True),
            dict(kernel="paged_decode_attention", sizes=dict(batch=80, kv_len=700, page_size=16,
                                                             kv_heads=2, group=2, head_dim=32),
                 ok=True)]
    traces = fitting.row_traces(rows, "trn2")
    assert all(t.loops for tr in traces for t in tr)         # device loops: barriers to fit
    for row, tr in zip(rows, traces):
        row["p50_us"] = fitting.model_seconds(tr, "trn2", {"loop_iteration_s": 4e-6}) * 1e6
    out = fitting.fit(dict(target="trn2", rows=rows), names=["loop_iteration_s"], samples=8,
                      log=lambda *_: None)
    assert out["constants"]["loop_iteration_s"] == pytest.approx(4e-6, rel=0.05)
    assert out["loss_fitted"] < out["loss_default"]
    assert "| loop_iteration_s | 9e-06 |" in fitting.markdown(out)


def test_load_calibration_refuses_a_file_without_constants(tmp_path):
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"rows": []}))
    with pytest.raises(ValueError, match="constants"):
        fitting.load_calibration(str(path))
    path.write_text(json.dumps({"constants": {"loop_iteration_s": 3e-6}}))
    assert fitting.load_calibration(str(path)) == {"loop_iteration_s": 3e-6}


@pytest.mark.parametrize("argv", [["validate"], ["validate", "--device", "trn"],
                                  ["bench", "--device", "trn", "--out", "OUT"],
                                  ["check", "tensor_scatter", "--device", "trn"]])
def test_device_commands_without_an_sdk_exit_with_one_line(argv, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("NKI_KERNELS_REHEARSE")}
    argv = [str(tmp_path) if a == "OUT" else a for a in argv]
    done = subprocess.run([sys.executable, "-m", "nki_kernels", *argv], capture_output=True,
                          text=True, env=env, timeout=120)
    assert done.returncode != 0
    lines = [x for x in done.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and "Neuron SDK" in lines[0] and "NKI_KERNELS_REHEARSE" in lines[0]
    assert done.stdout == ""


def test_default_install_imports_no_neuron_package():
    code = ("import sys, nki_kernels, nki_kernels.paged_attention, nki_kernels.cli, "
            "nki_kernels.device.measure, nki_kernels.device.fit; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('neuronxcc', 'torch_neuronx', 'nki', 'libneuronxla')))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert done.stdout.strip() == "[]", done.stderr
