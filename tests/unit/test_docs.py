"""The docs stay true: every Python example in README.md and docs/*.md runs as written, offline; the docs link
nothing outside the repository; and .ci/run runs the README's test command.

A page's ```python blocks run in order in one namespace per page, so a page defines everything its examples use.
A block that needs the built-in SmolLM2 is preceded by the line ``<!-- doc-test: slow -->``: it runs only in the
slow test (with the page's other blocks, in order); the fast test runs the other blocks alone. Text that is not
Python (shell commands, printed output) goes in a ```bash / ```text block or an indented one, which no test runs.
"""

from __future__ import annotations

import re
import socket
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = ["README.md", *sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").glob("*.md"))]
MARKERS = {"slow"}

_FENCE = re.compile(
    r"^(?:<!-- doc-test: (?P<marker>[^>]*?) -->\n)?```(?P<lang>[^\n`]*)\n(?P<code>.*?)^```", re.S | re.M
)


@dataclass(frozen=True)
class Block:
    line: int  # 1-based line of the opening fence
    marker: str | None
    code: str


def python_blocks(page: str) -> list[Block]:
    """The ```python blocks of ``page``, in order, each with its ``doc-test`` marker (or None)."""
    text = (ROOT / page).read_text()
    blocks = []
    for match in _FENCE.finditer(text):
        lang = match["lang"].strip()
        line = text.count("\n", 0, match.start("lang")) + 1
        assert lang not in {"py", "python3", "pycon", "Python"}, f"{page}:{line}: write ```python (run by this test)"
        if lang == "python":
            assert match["marker"] in MARKERS | {None}, f"{page}:{line}: unknown doc-test marker {match['marker']!r}"
            blocks.append(Block(line, match["marker"], match["code"]))
        else:
            assert match["marker"] is None, f"{page}:{line}: a doc-test marker on a ```{lang} block"
    return blocks


def _pages_with(slow: bool) -> list[str]:
    """Pages with a block for the fast (or slow) test; a page whose blocks do not parse is listed, to fail there."""
    pages = []
    for page in PAGES:
        try:
            if any((b.marker == "slow") == slow for b in python_blocks(page)):
                pages.append(page)
        except AssertionError:
            pages.append(page)
    return pages


@pytest.fixture
def offline(monkeypatch):
    """Any attempt to open a network connection fails the example."""

    def refuse(*args, **kwargs):
        raise AssertionError("a documentation example tried to use the network")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def run_page(page: str, blocks: list[Block]) -> None:
    namespace: dict = {"__name__": f"doc_{page}"}
    for block in blocks:
        # padded so that a traceback names the line of the page
        source = "\n" * block.line + block.code
        exec(compile(source, page, "exec"), namespace)  # noqa: S102 - our own docs


@pytest.mark.parametrize("page", _pages_with(slow=False))
def test_doc_examples_run(page, offline):
    """The blocks that need no real model, alone and in order."""
    run_page(page, [b for b in python_blocks(page) if b.marker is None])


@pytest.mark.slow
@pytest.mark.parametrize("page", _pages_with(slow=True))
def test_doc_examples_run_with_smollm2(page, offline):
    """Every block of a page that uses the built-in SmolLM2, in order."""
    run_page(page, python_blocks(page))


def test_every_python_block_is_tested():
    pages = [p for p in PAGES if python_blocks(p)]
    assert {"README.md", "docs/concepts.md", "docs/hf.md", "docs/benchmarks.md"} <= set(pages)
    for page in PAGES:
        text = (ROOT / page).read_text()
        assert text.count("```python\n") == len(python_blocks(page)), f"{page}: a ```python block the test misses"
        assert text.count("<!-- doc-test:") == sum(b.marker is not None for b in python_blocks(page)), (
            f"{page}: a doc-test marker that is not right above a ```python fence"
        )


@pytest.mark.parametrize("page", PAGES)
def test_docs_link_only_inside_the_repository(page):
    text = (ROOT / page).read_text()
    web = re.findall(r"https?://\S*", text, flags=re.I)
    assert not web, f"{page} links outside the repository (name the paper or package in plain text): {web}"
    base = (ROOT / page).parent
    for target in re.findall(r"\]\(([^)\s]+)\)", text):  # markdown links and images
        assert (base / target.split("#")[0]).resolve().is_relative_to(ROOT), f"{page}: {target} is outside the repo"
        assert (base / target.split("#")[0]).exists(), f"{page}: {target} does not exist"
    for path in re.findall(r"(?<![\w./-])(?:\.\./)+[\w./-]+", text):  # relative paths such as ../other/file.md
        resolved = (base / path.rstrip(".")).resolve()
        assert resolved.is_relative_to(ROOT) and resolved.exists(), f"{page}: {path} is not a file of the repository"


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    match = re.search(r"<!-- test-command -->\n    (.+)\n", readme)
    assert match, "README.md must mark its test command with <!-- test-command -->"
    assert "README.md" in (ROOT / ".ci/run").read_text()
