"""The README's usage example runs as printed."""

import pathlib

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


def test_usage_example_runs():
    text = README.read_text()
    start = text.index("```python\n", text.index("## Using the kernels")) + len("```python\n")
    code = text[start:text.index("```", start)]
    scope = {}
    exec(compile(code, str(README), "exec"), scope)        # noqa: S102  (our own README)
    assert scope["out"].shape == (5, 8, 64) and scope["present"].shape == (2, 2, 128, 64)
    assert scope["cache"].seq_len("a") == 32
