"""The Trainium path end to end, rehearsed on a CPU (NKI_KERNELS_REHEARSE=1): validate, bench
and calibrate --fit as a user runs them, the "device" running under constants the fit does not
see; the fit must recover them. Slow (about two minutes): .ci/run runs it."""

import json
import os
import subprocess
import sys

import pytest

HIDDEN = {"swdge_cycles_per_descriptor": 3.0, "loop_iteration_s": 4e-6}


def run(argv, env):
    done = subprocess.run([sys.executable, "-m", "nki_kernels", *argv], capture_output=True,
                          text=True, env=env, timeout=1200)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout


@pytest.mark.slow
def test_validate_bench_and_fit_recover_hidden_constants(tmp_path):
    env = dict(os.environ, NKI_KERNELS_REHEARSE="1", NKI_KERNELS_REHEARSE_CONSTANTS=",".join(
        f"{k}={v}" for k, v in HIDDEN.items()))
    out = run(["validate", "--device", "trn", "--quick"], env)
    assert "all kernels pass on the device" in out and "serving replay" in out
    run(["bench", "--device", "trn", "--quick", "--out", str(tmp_path), "--iters", "5"], env)
    measured = json.loads((tmp_path / "measured.json").read_text())
    assert measured["backend"] == "rehearsal" and len(measured["rows"]) >= 10
    assert all(r["ok"] and r["p50_us"] > 0 for r in measured["rows"])
    assert all(os.path.exists(x["ntff"]) for r in measured["rows"] for x in r["per_launch"])
    run(["calibrate", "--fit", str(tmp_path / "measured.json")], env)
    fitted = json.loads((tmp_path / "calibration.json").read_text())["constants"]
    for name, value in HIDDEN.items():
        assert fitted[name] == pytest.approx(value, rel=0.25), (name, fitted)
    # the fitted constants feed the modelled commands
    out = run(["profile", "tensor_scatter", "--calibration", str(tmp_path / "calibration.json")],
              dict(os.environ))
    assert "scheduled" in out
