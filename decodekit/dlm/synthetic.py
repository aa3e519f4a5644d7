"""Synthetic tasks with known answers where parallel decoding is known to break (after ParallelBench, Kim et al.
2025): each answer's tokens depend on one another, so committing several of them from their marginals in one step
can pick an incoherent combination even when each marginal is right.

Every item is a few-shot prompt, in one of two styles: Python-like lines (``style="lines"``, the default; the first
zoo DLM was adapted on Python source), answered on the next line; or chat turns (``style="chat"``, for a model
trained on chat responses such as ``smollm2-135m-bdlm``), each shot a user request and the assistant's bare answer,
through the tokenizer's chat template. The first line of the completion is compared with the known answer exactly.

| task | line | dependency |
|---|---|---|
| ``copy`` | ``copy([4, 1, 7]) == [4, 1, 7]`` | none beyond the input: the easy control |
| ``reverse`` | ``reverse([4, 1, 7]) == [7, 1, 4]`` | each slot reads a different input position |
| ``sort`` | ``sorted([4, 1, 7]) == [1, 4, 7]`` | each slot depends on the whole list and on the slots before it |
| ``join`` | ``" ".join(["the", "cat", "sat"]) == "the cat sat"`` | words to sentence, order given (a known answer) |
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

TASKS = ("copy", "reverse", "sort", "join")
STYLES = ("lines", "chat")
_REQUEST = {  # style="chat": the user's request of each task, around the case's input
    "copy": "Copy this list exactly: {}",
    "reverse": "Reverse this list: {}",
    "sort": "Sort this list in ascending order: {}",
    "join": "Join these words into one sentence, in this order: {}",
}
_SENTENCE = (
    "the cat sat on a mat while old dogs ran past green trees near one small red house by the river and two birds "
    "sang all day long under blue sky"
)
WORDS = tuple(_SENTENCE.split())


@dataclass(frozen=True)
class Item:
    """One question: ``prompt`` (few-shot lines, ending where the answer starts) and its ``answer``."""

    task: str
    prompt: str
    answer: str


def _case(task: str, rng: random.Random) -> tuple[str, str, str]:
    """``(question, answer, given)`` of one random case: the line is ``question + " " + answer``; ``given`` is the
    case's input, the list (of numbers or quoted words) a chat request holds."""
    if task == "join":
        words = rng.sample(WORDS, rng.randint(3, 6))
        given = "[" + ", ".join(f'"{w}"' for w in words) + "]"
        return f'" ".join({given}) ==', '"' + " ".join(words) + '"', given
    values = [rng.randint(0, 9) for _ in range(rng.randint(4, 7))]
    answer = {"copy": values, "reverse": values[::-1], "sort": sorted(values)}[task]
    name = {"copy": "copy", "reverse": "reverse", "sort": "sorted"}[task]
    return f"{name}({values}) ==", str(answer), str(values)


def _turns(task: str, given: str, answer: str | None) -> list[dict[str, str]]:
    """A case as chat turns: the user's request (the case's input ``given`` in :data:`_REQUEST`'s words) and, for a
    shot, the assistant's bare answer."""
    turns = [{"role": "user", "content": _REQUEST[task].format(given)}]
    return turns if answer is None else [*turns, {"role": "assistant", "content": answer}]


def make_items(
    task: str, count: int, seed: int = 0, shots: int = 4, style: str = "lines", tokenizer: Any = None
) -> list[Item]:
    """``count`` items of ``task`` (one of :data:`TASKS`), each with ``shots`` solved examples before it, as
    Python-like lines (``style="lines"``) or chat turns (``style="chat"``: ``tokenizer``'s chat template, ending
    where the assistant's answer starts). The cases are the same in both styles."""
    if task not in TASKS:
        raise ValueError(f"unknown synthetic task {task!r}; choose one of {TASKS}")
    if style not in STYLES:
        raise ValueError(f"unknown synthetic style {style!r}; choose one of {STYLES}")
    if style == "chat" and getattr(tokenizer, "chat_template", None) is None:
        raise ValueError("style='chat' needs a tokenizer with a chat template (the model's); pass tokenizer=...")
    rng = random.Random(f"{task}-{seed}")
    items = []
    for _ in range(count):
        solved = [_case(task, rng) for _ in range(shots)]
        question, answer, given = _case(task, rng)
        if style == "lines":
            prompt = "\n".join(f"{q} {a}" for q, a, _ in solved) + "\n" + question
        else:
            turns = [t for _, a, g in solved for t in _turns(task, g, a)] + _turns(task, given, None)
            prompt = tokenizer.apply_chat_template(turns, tokenize=False, add_generation_prompt=True)
        items.append(Item(task, prompt, answer))
    return items


def correct(item: Item, completion: str) -> bool:
    """Whether the completion's first line is exactly the item's answer (surrounding spaces ignored)."""
    return completion.split("\n", 1)[0].strip() == item.answer


def accuracy(items: list[Item], completions: list[str]) -> float:
    """The fraction of ``items`` whose completion (same order) is :func:`correct`."""
    return sum(correct(i, c) for i, c in zip(items, completions, strict=True)) / max(len(items), 1)


__all__ = ["STYLES", "TASKS", "Item", "accuracy", "correct", "make_items"]
