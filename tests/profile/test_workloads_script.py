"""benchmarks/workloads.py: its settings for a run (``--env``) and the table it writes."""

import os

import pytest

from .benchmark_scripts import load


def test_a_setting_applies_to_the_run_and_the_table_takes_its_name(tmp_path, monkeypatch):
    wl = load("workloads")
    monkeypatch.setenv("NKI_KERNELS_LEAD", "bucket")
    during, run_case = [], wl.run_case
    monkeypatch.setattr(wl, "run_case", lambda *a: during.append(
        os.environ.get("NKI_KERNELS_LEAD")) or run_case(*a))
    assert wl.main(["--targets", "trn2", "--only", "decode 1 x 512", "--out", str(tmp_path),
                    "--env", "NKI_KERNELS_LEAD=launch", "--table", "leads.md"]) == 0
    assert during == ["launch"] and os.environ["NKI_KERNELS_LEAD"] == "bucket"
    table = (tmp_path / "leads.md").read_text().splitlines()
    assert table[0] == "Settings: NKI_KERNELS_LEAD=launch"
    assert len(table) == 5 and table[4].startswith("| short chat decode 1 x 512 | trn2 |")


@pytest.mark.parametrize("setting", ["NKI_KERNELS_LEAD", "PATH=/tmp"])
def test_a_malformed_setting_is_refused(setting, capsys):
    wl = load("workloads")
    with pytest.raises(SystemExit):
        wl.main(["--only", "none", "--out", "", "--env", setting])
    assert "expected NKI_KERNELS_<NAME>=<value>" in capsys.readouterr().err
