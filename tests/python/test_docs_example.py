"""docs/python.md's worked example runs as written (so it cannot drift)."""
import contextlib
import io
import os
import re

DOC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "docs", "python.md")


def test_worked_example_runs():
    with open(DOC) as f:
        text = f.read()
    section = text.split("## Worked example", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(code, "docs/python.md", "exec"), {})
    lines = printed.getvalue().splitlines()
    assert lines[0] == "262144"
    assert lines[1] == "[4, 2, 2, 128, 2, 16]"
    assert lines[-1] == "[7, 5]"


def test_prefix_caching_example_runs():
    with open(DOC) as f:
        text = f.read()
    section = text.split("## Prefix caching", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(code, "docs/python.md", "exec"), {})
    assert printed.getvalue().splitlines() == [
        "0 8", "True", "['stored', 'stored']", "0.381", "8 [0, 1]"]


def test_storage_tiers_example_runs():
    with open(DOC) as f:
        text = f.read()
    section = text.split("## Storage tiers", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(code, "docs/python.md", "exec"), {})
    assert printed.getvalue().splitlines() == ["0", "0", "12", "['host', 'disk'] 3"]


def test_dlpack_example_runs_with_torch():
    import pytest
    pytest.importorskip("torch", reason="python3-torch is not installed")
    with open(DOC) as f:
        text = f.read()
    section = text.split("## DLPack", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(code, "docs/python.md", "exec"), {})
    assert printed.getvalue().splitlines() == ["torch.bfloat16 True"]


def test_pool_apart_example_runs():
    with open(DOC) as f:
        text = f.read()
    section = text.split("### A pool apart", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(code, "docs/python.md", "exec"), {})
    assert printed.getvalue().splitlines() == ["8 True 2"]
