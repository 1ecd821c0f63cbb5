"""docs/serving.md's code blocks run as printed (HF continuous batching needs the torch extra)."""

import pathlib
import re

import pytest

DOC = pathlib.Path(__file__).resolve().parents[1] / "docs" / "serving.md"
BLOCKS = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)


def test_there_are_two_examples():
    assert len(BLOCKS) == 2


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_block_runs(index):
    code = BLOCKS[index]
    if "transformers" in code:
        pytest.importorskip("transformers")
    exec(compile(code, f"{DOC}:block{index}", "exec"), {})     # noqa: S102  (our own doc)
