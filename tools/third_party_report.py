"""Run every third-party kernel harness over local checkouts and tabulate ran / matched per source.

Usage::

    python3 tools/third_party_report.py --nki-library PATH [--nki-library-old PATH]
        [--sdk PATH] [--nxdi PATH] [--vllm-neuron PATH]

Each harness runs the source's kernels unchanged in the simulator (nothing is copied into this
repository): ``third_party_kernels.py`` (AWS's nki-library, its own references; an older commit
of it through the same cases), ``sdk_example_kernels.py`` (the SDK documentation's tutorials and
MX deep dive), ``nxdi_contrib_kernels.py`` (NxD Inference model ports), ``vllm_neuron_kernels.py``
(vllm-neuron's collectives). Sources not given are listed as not run. Prints a markdown table and
each failure with its first line.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCES = (  # (label, flag, harness, its path flag)
    ("AWS nki-library", "nki_library", "third_party_kernels.py", "--nki-library"),
    ("AWS nki-library, an older commit", "nki_library_old", "third_party_kernels.py",
     "--nki-library"),
    ("Neuron SDK docs: tutorials and MX deep dive", "sdk", "sdk_example_kernels.py", "--sdk"),
    ("NxD Inference model ports (Qwen3.5, GLM-5, LTX-2)", "nxdi", "nxdi_contrib_kernels.py",
     "--nxdi"),
    ("vllm-neuron collectives", "vllm_neuron", "vllm_neuron_kernels.py", "--vllm-neuron"),
)


def commit_of(path):
    try:
        return subprocess.run(["git", "-C", path, "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "(no git)"


def run_source(harness, flag, path):
    """(passed, failed, skipped, failure lines) of one harness run."""
    done = subprocess.run([sys.executable, os.path.join(HERE, harness), flag, path],
                          capture_output=True, text=True)
    text = done.stdout
    m = re.search(r"(\d+) passed, (\d+) failed(?:, (\d+) skipped)?", text)
    if not m:
        return 0, 0, 0, [f"harness did not finish: {done.stderr.strip().splitlines()[-1:]}"]
    failures = [ln.strip() for ln in text.splitlines()
                if ln.strip().startswith("FAILED") or re.match(r"\[.*\] (error|mismatch|not)",
                                                               ln.strip())]
    return int(m.group(1)), int(m.group(2)), int(m.group(3) or 0), failures


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for _, dest, _, _ in SOURCES:
        parser.add_argument("--" + dest.replace("_", "-"), dest=dest)
    args = parser.parse_args(argv)
    rows, details = [], []
    for label, dest, harness, flag in SOURCES:
        path = getattr(args, dest)
        if not path:
            rows.append(f"| {label} | - | not run (no checkout given) | | |")
            continue
        passed, failed, skipped, failures = run_source(harness, flag, path)
        rows.append(f"| {label} | {commit_of(path)} | {passed + failed} | {passed} | "
                    f"{failed}{f' (+{skipped} prose fragments skipped)' if skipped else ''} |")
        details += [f"{label}: {f}" for f in failures]
        print(f"{label}: {passed} matched of {passed + failed}", flush=True)
    print("\n| source | commit | kernels run | matched | failed |\n|---|---|---|---|---|")
    print("\n".join(rows))
    if details:
        print("\nfailures:\n" + "\n".join(details))
    return 0


if __name__ == "__main__":
    sys.exit(main())
