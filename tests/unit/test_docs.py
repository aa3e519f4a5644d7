"""The docs stay true: their Python examples run, and .ci/run runs the README's test command."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def python_blocks(path: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", path.read_text(), flags=re.S)


@pytest.mark.parametrize("page", ["docs/concepts.md"])
def test_doc_examples_run(page):
    blocks = python_blocks(ROOT / page)
    assert blocks, f"{page} has no python examples"
    namespace: dict = {}
    for block in blocks:
        exec(compile(block, page, "exec"), namespace)  # noqa: S102 - our own docs


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    match = re.search(r"<!-- test-command -->\n    (.+)\n", readme)
    assert match, "README.md must mark its test command with <!-- test-command -->"
    assert "README.md" in (ROOT / ".ci/run").read_text()
