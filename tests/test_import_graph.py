"""No import circles: the modules of each package form a DAG (function-level imports count)."""

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
# folder -> the name it is imported under
PACKAGES = {"simulate": "nki_kernels.simulate", "access_patterns": "nki_kernels.access_patterns",
            "nki_kernels": "nki_kernels"}


def module_name(path: pathlib.Path) -> str:
    folder = path.relative_to(ROOT).parts[0]
    rel = path.relative_to(ROOT / folder).with_suffix("")
    parts = [PACKAGES[folder]] + [p for p in rel.parts if p != "__init__"]
    return ".".join(parts)


def imports_of(path: pathlib.Path, name: str, known: set) -> set:
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            modules = [f"{target}.{a.name}" for a in node.names if f"{target}.{a.name}" in known]
            # `from . import sibling` imports the sibling module, not the package's __init__
            candidates = modules if len(modules) == len(node.names) else [target] + modules
        elif isinstance(node, ast.Import):
            candidates = [a.name for a in node.names]
        else:
            continue
        found.update(c for c in candidates if c in known and c != name)
    return found


def graph() -> dict:
    files = {module_name(p): p for folder in PACKAGES for p in (ROOT / folder).rglob("*.py")}
    known = set(files)
    return {name: imports_of(path, name, known) for name, path in files.items()}


def cycles(edges: dict) -> list:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in edges:
        if v not in index:
            visit(v)
    return out


def test_cycle_finder_sees_a_circle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


@pytest.mark.parametrize("package", sorted(PACKAGES.values()))
def test_no_import_circles(package):
    edges = graph()
    inside = {m: {d for d in ds if d == package or d.startswith(package + ".")}
              for m, ds in edges.items() if m == package or m.startswith(package + ".")}
    # a package's __init__ re-exporting its own modules is not a circle of theirs
    inside = {m: {d for d in ds if not (d == package and m != package)} for m, ds in inside.items()}
    assert cycles(inside) == []
