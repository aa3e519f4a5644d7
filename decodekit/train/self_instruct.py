"""Chat prompts the target writes itself (Magpie: Xu et al., 2024, "Alignment Data Synthesis from Scratch by
Prompting Aligned LLMs with Nothing"), for self-distillation data that reaches past one prompt source.

An instruction-tuned model given its chat template up to where a user's message begins continues it with a
plausible user message: the distribution of requests it was tuned on (writing, reasoning, maths, code, advice).
Sampled at temperature 1 until the end of the turn, each continuation is one request; put back into the template
with the generation prompt, it is a chat prompt the target then answers (greedy, :func:`~decodekit.train.
sequences.answer`). Faithful to Magpie's first step (the pre-query template, temperature-1 sampling, one turn);
its filtering by quality and difficulty is not done here: requests that run past ``max_query_tokens`` without
ending, are shorter than 4 tokens or repeat an earlier one are dropped, nothing else. No prompt set is read.
"""

from __future__ import annotations

from typing import Any

from tqdm.auto import tqdm

MARKER = "\x00"  # stands for the user's message while the template is rendered


def pre_query_ids(tokenizer: Any) -> list[int]:
    """The chat template's tokens up to where a user's message begins (its default system turn included)."""
    text = tokenizer.apply_chat_template([{"role": "user", "content": MARKER}], tokenize=False)
    if MARKER not in text:
        raise ValueError("the tokenizer's chat template does not place the user's message in its text")
    return tokenizer(text[: text.index(MARKER)], add_special_tokens=False)["input_ids"]


def self_instruct_prompts(
    target: Any, num: int, max_query_tokens: int, max_prompt_tokens: int, seed: int, batch_size: int, progress: bool
) -> list[list[int]]:
    """Up to ``num`` distinct chat prompts (token ids, with the generation prompt) whose user message the target
    sampled itself (module docstring); row ``i`` of the sampling uses seed ``seed * 1_000_003 + i``, so a run is
    reproducible and no two rows share a stream. Fewer than ``num`` when rows are dropped."""
    import decodekit as dk

    tokenizer = target.tokenizer
    pre = pre_query_ids(tokenizer)
    end = tokenizer.eos_token_id
    prompts, seen = [], set()
    bar = tqdm(total=num, desc="self-instruct requests", unit="request", disable=not progress)
    for start in range(0, num, batch_size):
        rows = range(start, min(num, start + batch_size))
        out = dk.generate(
            target, [pre] * len(rows), max_new_tokens=max_query_tokens, temperature=1.0, eos_token_id=end,
            seed=[seed * 1_000_003 + i for i in rows],
        )  # fmt: skip
        for query in out.sequences:
            if len(query) < 5 or query[-1] != end:  # too short, or cut off before the end of the turn
                continue
            text = tokenizer.decode(query[:-1]).strip()
            if not text or text in seen:
                continue
            seen.add(text)
            ids = tokenizer.apply_chat_template(
                [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True, return_dict=True
            )["input_ids"]
            if len(ids) <= max_prompt_tokens:
                prompts.append(list(ids))
        bar.update(len(rows))
    bar.close()
    return prompts
