"""The stdlib prompt miner: code-completion prompts cut from the running Python's standard library source.

Files: every ``.py`` file under ``sysconfig.get_paths()["stdlib"]`` (the directory of ``os``), minus tests, demos,
vendored and generated code (``test``, ``idlelib``, ``lib2to3``, ``encodings``, ...), sorted, then shuffled with
``seed``. Each file gives at most one prompt: a seeded choice of a function (or method) with at least two
statements after its docstring, cut either at the start of its body (after signature and docstring) or just before
one of its later top-level statements. The prompt is the source text before the cut, its start moved to a
statement boundary so that it holds a seeded target of 128-512 tokens (capped by ``max_prompt_tokens``);
candidates without that much preceding code are passed over. ``reference`` is the rest of the function.
Deterministic for a given seed, tokenizer and Python version. The text is under the PSF license.
"""

from __future__ import annotations

import ast
import os
import random
import sysconfig
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from decodekit.bench.tokenizer_shim import encode
from decodekit.errors import ConfigError

__all__ = ["mine_stdlib_prompts"]

_TOKENS_LOW = 128
_TOKENS_HIGH = 512
_TRIES_PER_FILE = 8
_MAX_CHARS_PER_TOKEN = 32  # bounds how far back a window may reach
# Directory names under the stdlib that hold tests, demos, generated tables, vendored or non-stdlib code.
_SKIP_DIRS = frozenset(
    {
        "test",
        "tests",
        "idlelib",
        "lib2to3",
        "turtledemo",
        "pydoc_data",
        "encodings",
        "ensurepip",
        "site-packages",
        "dist-packages",
        "lib-dynload",
        "__pycache__",
        "__phello__",
    }
)


def mine_stdlib_prompts(tokenizer: Any, count: int, max_prompt_tokens: int, seed: int) -> list[dict]:
    """``count`` stdlib prompts (rows with ``id, task, category, source, prompt, reference, input_ids,
    num_tokens``), each at most ``max_prompt_tokens`` tokens; see the module docstring for how they are cut.

    Raises:
        ConfigError: the standard library has no source files, or fewer than ``count`` prompts can be cut.
    """
    high = min(_TOKENS_HIGH, max_prompt_tokens)
    low = min(_TOKENS_LOW, high)
    root = Path(sysconfig.get_paths()["stdlib"])
    files = _stdlib_files(root)
    if not files:
        raise ConfigError(f"no Python source files found under the standard library directory {root}")
    random.Random(seed).shuffle(files)
    rows: list[dict] = []
    for rel in files:
        row = _stdlib_prompt(root, rel, tokenizer, low, high, seed)
        if row is not None:
            rows.append(row)
            if len(rows) == count:
                return rows
    raise ConfigError(
        f"only {len(rows)} stdlib prompts could be cut (asked for {count}) with max_prompt_tokens="
        f"{max_prompt_tokens}; lower num_prompts"
    )


def _stdlib_files(root: Path) -> list[str]:
    """Sorted ``.py`` paths (relative, POSIX form) under ``root``, without test / demo / generated directories."""
    out: list[str] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS and not d.startswith("config-"))
        rel_dir = Path(dirpath).relative_to(root)
        for fn in filenames:
            if fn.endswith(".py") and not fn.startswith(("test_", "_sysconfigdata")):
                out.append((rel_dir / fn).as_posix())
    return sorted(out)


def _stdlib_prompt(root: Path, rel: str, tokenizer: Any, low: int, high: int, seed: int) -> dict | None:
    """One prompt cut from file ``rel``, or ``None`` when the file has no usable cut point."""
    try:
        source = (root / rel).read_text(encoding="utf-8")
        tree = ast.parse(source)
    except (OSError, UnicodeDecodeError, SyntaxError, ValueError):
        return None
    lines = source.splitlines(keepends=True)
    funcs = sorted(
        (n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))),
        key=lambda n: (n.lineno, n.col_offset),
    )
    usable = [(cuts, f.end_lineno or f.lineno) for f in funcs if (cuts := _cut_points(f, lines))]
    if not usable:
        return None
    starts = sorted(_statement_starts(tree, lines))
    rng = random.Random(f"decodekit-stdlib:{seed}:{rel}")  # per file: a file's prompt ignores the file order
    for _ in range(_TRIES_PER_FILE):
        cuts, end = rng.choice(usable)
        cut = cuts[0] if rng.random() < 0.5 else rng.choice(cuts[1:])
        target = rng.randint(low, high)
        start = _window_start(lines, starts, cut, target, low, tokenizer)
        if start is None:
            continue
        prompt = "".join(lines[start:cut])
        ids = encode(tokenizer, prompt, special=True)
        return {
            "id": f"stdlib/{rel}:{cut + 1}",
            "task": "stdlib",
            "category": "code",
            "source": f"{rel}:{start + 1}-{cut}",
            "prompt": prompt,
            "reference": "".join(lines[cut:end]),
            "input_ids": ids,
            "num_tokens": len(ids),
        }
    return None


def _first_line(node: ast.stmt) -> int:
    """0-based first line of a statement, decorators included."""
    decorators = getattr(node, "decorator_list", None) or []
    return min([node.lineno, *(d.lineno for d in decorators)]) - 1


def _starts_line(node: ast.stmt, lines: Sequence[str]) -> bool:
    """Whether the statement is the first thing on its line (so cutting before that line cuts before it)."""
    if getattr(node, "decorator_list", None):
        return True  # a decorator always begins its line
    line = lines[node.lineno - 1] if node.lineno - 1 < len(lines) else ""
    return not line.encode("utf-8")[: node.col_offset].strip()  # col_offset counts UTF-8 bytes


def _cut_points(func: ast.FunctionDef | ast.AsyncFunctionDef, lines: Sequence[str]) -> list[int]:
    """0-based line indices where a prompt may end: ``[body start, later statements...]``; ``[]`` if unusable.

    The body start is the line of the first statement after the docstring. A function qualifies with at least
    two such statements, each starting its own line, and a body that does not share the ``def`` line.
    """
    body = list(func.body)
    first = body[0] if body else None
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
        body = body[1:]
    if len(body) < 2 or not all(_starts_line(s, lines) for s in body):
        return []
    cuts = [_first_line(s) for s in body]
    return cuts if cuts[0] > func.lineno - 1 else []


def _statement_starts(tree: ast.AST, lines: Sequence[str]) -> set[int]:
    """0-based lines where some statement begins (the places a prompt may start without cutting a statement)."""
    return {_first_line(n) for n in ast.walk(tree) if isinstance(n, ast.stmt) and _starts_line(n, lines)}


def _window_start(
    lines: Sequence[str], starts: Sequence[int], cut: int, target: int, low: int, tokenizer: Any
) -> int | None:
    """Earliest statement start before ``cut`` whose text up to ``cut`` has between ``low`` and ``target`` tokens.

    ``None`` when no statement start gives such a window (too little code before ``cut``, or a statement too
    long to fit).
    """
    # Only look back so far that no real tokenizer could fit the window in ``target`` tokens (keeps it cheap).
    max_chars = _MAX_CHARS_PER_TOKEN * target
    candidates: list[int] = []
    chars = 0
    prev = cut
    for s in reversed([s for s in starts if s < cut]):
        chars += sum(len(line) for line in lines[s:prev])
        prev = s
        if chars > max_chars:
            break
        candidates.append(s)
    candidates.reverse()  # earliest first; the token count does not increase along this list
    if not candidates:
        return None

    counts: dict[int, int] = {}

    def count(start: int) -> int:
        if start not in counts:
            counts[start] = len(encode(tokenizer, "".join(lines[start:cut]), special=True))
        return counts[start]

    if count(candidates[0]) < low or count(candidates[-1]) > target:
        return None
    lo, hi = 0, len(candidates) - 1  # binary search the first start whose window fits in ``target``
    while lo < hi:
        mid = (lo + hi) // 2
        if count(candidates[mid]) <= target:
            hi = mid
        else:
            lo = mid + 1
    start = candidates[lo]
    if count(start) < low or not "".join(lines[start:cut]).strip():
        return None
    return start
