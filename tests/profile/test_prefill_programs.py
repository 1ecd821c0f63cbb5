"""benchmarks/prefill_programs.py: a policy's serving loop counted and timed, the settings
restored after."""

import os

from .benchmark_scripts import load


def test_one_step_of_a_policy_is_timed_and_its_program_counted(tmp_path, monkeypatch):
    pp = load("prefill_programs")
    monkeypatch.setenv("NKI_KERNELS_TAIL_PROFILE", "off")       # restored by the script
    assert pp.main(["--steps", "1", "--policies", "leads a launch reaches",
                    "--out", str(tmp_path)]) == 0
    rows = (tmp_path / "prefill_programs.md").read_text().splitlines()
    assert len(rows) == 3 and rows[2].startswith("| leads a launch reaches | ")
    cells = [c.strip() for c in rows[2].split("|")[2:4]]
    for cell in cells:                                      # "us, programs" on each core count
        us, programs = cell.split(", ")
        assert float(us) > 0 and programs == "1"
    assert os.environ["NKI_KERNELS_TAIL_PROFILE"] == "off"
    assert "NKI_KERNELS_LEAD" not in os.environ


def test_the_policies_name_only_settings_the_planning_reads():
    from nki_kernels import buckets
    pp = load("prefill_programs")
    known = {buckets.LEAD_ENV, buckets.PROFILE_ENV, buckets.PROGRAMS_ENV}
    assert set(pp.SETTINGS) == known
    assert all(set(settings) <= known for _, settings in pp.POLICIES)
