"""Regenerate ``simulate/manifest.json`` from a checkout of github.com/aws-neuron/aws-neuron-sdk.

Usage: ``python3 tools/nki_manifest.py --sdk PATH``. Reads the NKI reference stubs under
``nki/api/nki`` (documented names, parameters and defaults) and the names the docs' own code
imports from ``nki`` modules the stubs do not list, records for each its doc source
(repository, commit, file and line) and the simulator's status (see ``simulate/manifest.py``), and
prints the coverage.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

STUBS = {"nki": "__init__.py", "nki.language": "language/__init__.py",
         "nki.isa": "isa/__init__.py", "nki.collectives": "collectives/__init__.py"}


def _parameters(fn: ast.FunctionDef):
    args = fn.args
    plain = args.posonlyargs + args.args
    defaults = [None] * (len(plain) - len(args.defaults)) + list(args.defaults)
    out = [{"name": a.arg, "default": None if d is None else ast.unparse(d)}
           for a, d in zip(plain, defaults)]
    out += [{"name": a.arg, "default": None if d is None else ast.unparse(d)}
            for a, d in zip(args.kwonlyargs, args.kw_defaults)]
    return out


def read_stubs(root, commit):
    names = []
    for module, rel in STUBS.items():
        path = os.path.join(root, "nki", "api", "nki", rel)
        tree = ast.parse(open(path).read())
        for node in tree.body:
            source = f"aws-neuron/aws-neuron-sdk@{commit[:7]} nki/api/nki/{rel}:{node.lineno}"
            if isinstance(node, ast.FunctionDef) and not node.name.startswith("_"):
                names.append({"module": module, "name": node.name, "kind": "function",
                              "parameters": _parameters(node), "source": source})
            elif isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                names.append({"module": module, "name": node.name, "kind": "class",
                              "source": source})
            elif isinstance(node, (ast.AnnAssign, ast.Assign)):
                targets = [node.target] if isinstance(node, ast.AnnAssign) else node.targets
                for t in targets:
                    if isinstance(t, ast.Name) and not t.id.startswith("_"):
                        names.append({"module": module, "name": t.id, "kind": "constant",
                                      "source": source})
    return names


IMPORT = re.compile(r"^\s*from (nki(?:\.\w+)*) import ([\w, ]+)$", re.MULTILINE)


def read_imports(root, commit, listed):
    """Names the docs' code imports from ``nki`` modules (examples, tutorials, guides' code
    blocks: ``from nki.M import a, b``) that the API stubs do not list, e.g. the average-pool
    tutorial's ``from nki.typing import tensor``: each an entry of kind "imported"."""
    seen = {(e["module"], e["name"]) for e in listed}
    found = []
    for base, _, files in sorted(os.walk(os.path.join(root, "nki"))):
        for name in sorted(files):
            if not name.endswith((".py", ".rst", ".md", ".ipynb")):
                continue
            path = os.path.join(base, name)
            text = open(path, encoding="utf-8", errors="replace").read()
            for m in IMPORT.finditer(text):
                module = m.group(1)
                line = text.count("\n", 0, m.start()) + 1
                rel = os.path.relpath(path, root)
                for imported in (n.strip() for n in m.group(2).split(",")):
                    if imported and (module, imported) not in seen:
                        seen.add((module, imported))
                        found.append({"module": module, "name": imported, "kind": "imported",
                                      "source": f"aws-neuron/aws-neuron-sdk@{commit[:7]} "
                                                f"{rel}:{line}"})
    return found


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sdk", required=True, help="checkout of aws-neuron/aws-neuron-sdk")
    args = parser.parse_args(argv)
    commit = subprocess.run(["git", "-C", args.sdk, "rev-parse", "HEAD"], capture_output=True,
                            text=True).stdout.strip() or "unknown"
    from nki_kernels.simulate import manifest
    from nki_kernels.simulate.nki_module import build_modules
    entries = read_stubs(args.sdk, commit)
    entries += read_imports(args.sdk, commit, entries)
    modules = build_modules()
    for e in entries:
        e["status"], reason = manifest.status_of(e, modules)
        if reason and e["status"] != "implemented":
            e["note"] = reason
    with open(manifest.MANIFEST, "w") as f:
        json.dump({"source": f"aws-neuron/aws-neuron-sdk@{commit}", "names": entries}, f, indent=1)
        f.write("\n")
    summary = manifest.check(entries)
    print(f"{summary['counts'].get('implemented', 0)} implemented, "
          f"{summary['counts'].get('partial', 0)} partial, "
          f"{summary['counts'].get('not yet', 0)} not yet, of {summary['total']} documented names")


if __name__ == "__main__":
    main()
