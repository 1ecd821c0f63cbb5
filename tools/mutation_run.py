"""Mutation testing (mutmut 3) of chosen modules against chosen tests, in a scratch copy.

    python3 tools/mutation_run.py --modules nki_kernels/block_tables.py \
        --tests tests/kernels/test_block_tables.py [--children 2] [--keep DIR]

mutmut copies only the mutated files into its ``mutants/`` tree, and this repository's package
imports its neighbours (and the simulator beside it), so the script lists everything else as
``also_copy``: each directory that holds no mutated file whole, and the other files beside
the mutants one by one (copying their directory would overwrite the mutants). It runs in a clone of HEAD, so
the working tree is untouched, then prints killed / timed-out / survived counts, the score
(killed and timed out over all) and each survivor's diff line.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def also_copy(files: list[str], mutated: set[str]) -> list[str]:
    """Paths to copy beside the mutants: for each other file, its shallowest ancestor (or the
    file itself) that holds no mutated file, so no copy overwrites a mutant."""
    holders = {"/".join(m.split("/")[:depth]) for m in mutated
               for depth in range(1, len(m.split("/")))}
    out = set()
    for f in files:
        if f in mutated:
            continue
        parts = f.split("/")
        out.add(next("/".join(parts[:depth]) for depth in range(1, len(parts) + 1)
                     if "/".join(parts[:depth]) not in holders))
    return sorted(out)


BESIDE = ("simulate", "access_patterns")      # installed as nki_kernels.<name>


def installed_layout(work: Path, modules: list[str]) -> list[str]:
    """Move ``simulate/`` and ``access_patterns/`` into ``nki_kernels/`` in the scratch clone
    when a module under them is mutated, and return the modules' new paths. The tests import
    them as ``nki_kernels.simulate...``; mutmut names a mutant after its file's path, so the
    file must sit where its import name says, or no test is ever recorded as reaching it."""
    moved = {name for name in BESIDE if any(m.startswith(name + "/") for m in modules)}
    for name in sorted(moved):
        subprocess.run(["git", "mv", name, f"nki_kernels/{name}"], cwd=work, check=True)
    return [f"nki_kernels/{m}" if m.split("/")[0] in moved else m for m in modules]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--modules", nargs="+", required=True)
    parser.add_argument("--tests", nargs="+", required=True)
    parser.add_argument("--children", type=int, default=2)
    parser.add_argument("--keep", help="run in this directory (kept) instead of a temporary one")
    args = parser.parse_args(argv)
    work = Path(args.keep or tempfile.mkdtemp(prefix="mutation-"))
    if work.exists() and any(work.iterdir()):
        shutil.rmtree(work)
    subprocess.run(["git", "clone", "-q", str(ROOT), str(work)], check=True)
    args.modules = installed_layout(work, args.modules)
    files = subprocess.run(["git", "ls-files"], cwd=work, capture_output=True, text=True,
                           check=True).stdout.split()
    files = [f for f in files if not f.startswith((".", "mutants/"))]
    copy = also_copy(files, set(args.modules))
    quote = lambda items: "[" + ", ".join(f'"{i}"' for i in items) + "]"  # noqa: E731
    with open(work / "pyproject.toml", "a") as f:
        f.write(f"\n[tool.mutmut]\npaths_to_mutate = {quote(args.modules)}\n"
                f"tests_dir = {quote(args.tests)}\nalso_copy = {quote(copy)}\n")
    run = subprocess.run(["mutmut", "run", "--max-children", str(args.children)], cwd=work,
                         capture_output=True, text=True)
    if run.returncode:
        print(run.stdout[-2000:], run.stderr[-2000:], file=sys.stderr)
        return run.returncode
    results = subprocess.run(["mutmut", "results", "--all", "true"], cwd=work,
                             capture_output=True, text=True).stdout.splitlines()
    status = Counter(line.rsplit(":", 1)[1].strip() for line in results if ":" in line)
    total = sum(status.values())
    detected = status["killed"] + status["timeout"]
    print(f"{total} mutants: {status['killed']} killed, {status['timeout']} timed out, "
          f"{status['survived']} survived, {total - detected - status['survived']} other; "
          f"score {100 * detected / max(total, 1):.1f}%")
    for line in results:
        if line.endswith("survived"):
            name = line.rsplit(":", 1)[0].strip()
            diff = subprocess.run(["mutmut", "show", name], cwd=work, capture_output=True,
                                  text=True).stdout
            change = [d for d in diff.splitlines() if re.match(r"^\+\s", d)]
            print(f"  {name}: {change[-1][1:].strip() if change else '?'}")
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
