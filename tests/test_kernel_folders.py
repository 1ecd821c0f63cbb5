"""Every kernel folder has the same files: its entry (api), kernel, reference, checks; the
former attention package name is an alias of the same objects."""

import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1] / "nki_kernels"
KERNEL_FOLDERS = ("paged_kv_append", "paged_attention", "tensor_scatter")


@pytest.mark.parametrize("folder", KERNEL_FOLDERS)
def test_kernel_folder_has_the_conventional_files(folder):
    names = {p.name for p in (ROOT / folder).glob("*.py")}
    assert {"api.py", "kernel.py", "reference.py", "checks.py"} <= names


def test_every_api_entry_has_a_reference():
    import nki_kernels.paged_attention as pa
    import nki_kernels.paged_kv_append as kv
    import nki_kernels.tensor_scatter as ts
    from nki_kernels import block_tables
    for module, entries in ((pa, ("batch_decode", "batch_prefill")),
                            (kv, ("append_paged_kv_cache", "reshape_and_cache")),
                            (ts, ("tensor_scatter",)),
                            (block_tables, ("append_kv_with_block_tables",
                                            "attention_with_block_tables"))):
        for name in entries:
            assert callable(getattr(module, name)) and callable(getattr(module, name + "_ref"))


def test_former_attention_name_is_an_alias():
    import nki_kernels.paged_attention as new
    import nki_kernels.paged_decode_attention as old
    for name in new.__all__:
        assert getattr(old, name) is getattr(new, name)


def test_no_function_over_120_lines():
    import ast
    long = []
    for top in ("nki_kernels", "simulate", "access_patterns"):
        for path in (ROOT.parent / top).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.FunctionDef) and node.end_lineno - node.lineno >= 120:
                    long.append(f"{path.name}:{node.name}")
    assert long == []
