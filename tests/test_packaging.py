"""The wheel's package list covers every package directory, the simulator and the access patterns
install inside the nki_kernels namespace (never as top-level `simulate` / `access_patterns`, names
other PyPI packages use), and a built wheel runs a kernel in a fresh venv (slow)."""

import pathlib
import subprocess
import sys

import pytest

tomllib = pytest.importorskip("tomllib")

ROOT = pathlib.Path(__file__).resolve().parents[1]
SETUP = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]


def _installed_name(directory: pathlib.Path) -> str:
    rel = directory.relative_to(ROOT).parts
    return ".".join(rel if rel[0] == "nki_kernels" else ("nki_kernels", *rel))


def test_every_package_directory_is_in_the_wheel():
    found = {_installed_name(p.parent) for top in ("nki_kernels", "simulate", "access_patterns")
             for p in (ROOT / top).rglob("__init__.py")}
    assert found == set(SETUP["packages"])


def test_no_top_level_module_but_nki_kernels():
    assert all(name.split(".")[0] == "nki_kernels" for name in SETUP["packages"])
    assert SETUP["package-dir"] == {"nki_kernels.simulate": "simulate",
                                    "nki_kernels.access_patterns": "access_patterns"}


def test_old_top_level_name_is_refused_with_the_new_one():
    code = "import simulate"
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode != 0 and "from nki_kernels import simulate" in result.stderr


@pytest.mark.slow
def test_wheel_installs_and_runs_in_a_fresh_venv(tmp_path):
    """Core dependencies only (numpy, ml_dtypes): the simulator stands in for nki and an append
    runs; `simulate` stays free for other packages."""
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", tmp_path, ROOT],
                   check=True)
    wheel = next(tmp_path.glob("nki_kernels-*.whl"))
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", venv], check=True)
    python = venv / "bin" / "python"
    subprocess.run([python, "-m", "pip", "install", "-q", wheel], check=True)
    script = (
        "import importlib.util, numpy as np\n"
        "from nki_kernels import simulate\n"
        "from nki_kernels.paged_kv_append import reshape_and_cache\n"
        "k = np.ones((3, 2, 4), np.float32); kc = np.zeros((4, 2, 2, 4), np.float32)\n"
        "vc = np.zeros_like(kc)\n"
        "reshape_and_cache(k, k, kc, vc, np.array([0, 5, 7]))\n"
        "assert kc.sum() == 24 and importlib.util.find_spec('simulate') is None\n"
        "simulate.install(); import nki; assert nki.__nki_kernels_simulator__\n"
        "print('ok')\n")
    result = subprocess.run([python, "-c", script], cwd=tmp_path, capture_output=True, text=True)
    assert result.stdout.strip() == "ok", result.stderr
