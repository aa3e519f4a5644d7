"""Self-distilled acceptance data for SpecDec++'s head (``data/gen_*.py`` of the reference, in one pass).

For each prompt the target writes a greedy response ``X``. At every response position ``t`` the draft, reading the
target's prefix, gives ``q_t``; two draft tokens are labelled there:

- greedy: ``Z_t = argmax q_t``, label ``1[Z_t = argmax p_t]`` (acceptance at temperature 0);
- sampled: ``Z_t ~ q_t`` (temperature 1), soft label ``min(1, p_t(Z_t) / q_t(Z_t))`` (rejection sampling's
  acceptance probability).

As in the paper, each position holds the target token ``X_t`` with probability ``mixing`` (unlabelled), else the
draft token; the draft model then reads this mixed sequence and its final hidden state at ``Z_t``'s position is the
head's input for ``Z_t``'s label. Only labelled positions are stored: one row per (position, kind).
"""

from __future__ import annotations

import json
import random
import re
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

import decodekit as dk
from decodekit.masks import chain_mask
from decodekit.models.base import LanguageModel, ModelOutput

DATA_SOURCE = "pydoc_data.topics (the Python reference documentation shipped with CPython)"
QUESTIONS = (
    "Explain this part of the Python documentation in simple words:\n\n{}",
    "Summarize the following excerpt from the Python reference manual:\n\n{}",
    "{}\n\nWrite a short Python example that illustrates the text above.",
    "Here is some Python documentation:\n\n{}\n\nWhat are the key points?",
)


def pydoc_snippets(seed: int = 0, min_chars: int = 300, max_chars: int = 1200) -> list[str]:
    """Snippets of the Python reference documentation (``pydoc_data.topics``, offline, not a benchmark's prompt
    set): consecutive paragraphs of one topic joined to ``min_chars``..``max_chars`` characters, shuffled."""
    from pydoc_data.topics import topics

    snippets = []
    for name in sorted(topics):
        current = ""
        for paragraph in re.split(r"\n\s*\n", topics[name]):
            paragraph = paragraph.strip()[:max_chars]
            if current and len(current) + len(paragraph) > max_chars:
                snippets.append(current)
                current = ""
            current = f"{current}\n\n{paragraph}" if current else paragraph
            if len(current) >= min_chars:
                snippets.append(current)
                current = ""
    random.Random(seed).shuffle(snippets)
    return snippets


def pydoc_prompts(tokenizer: Any, num_prompts: int, max_prompt_tokens: int, seed: int = 0) -> list[list[int]]:
    """``num_prompts`` chat prompts (token ids, the tokenizer's chat template) asking about documentation
    snippets; prompts longer than ``max_prompt_tokens`` are skipped."""
    prompts: list[list[int]] = []
    for i, snippet in enumerate(pydoc_snippets(seed) if num_prompts > 0 else ()):  # 0 asks for none, not all
        text = QUESTIONS[i % len(QUESTIONS)].format(snippet)
        ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True, return_dict=True
        )["input_ids"]
        if len(ids) <= max_prompt_tokens:
            prompts.append(list(ids))
        if len(prompts) == num_prompts:
            break
    return prompts


def _forward(
    model: LanguageModel, tokens: torch.Tensor, logits_at: torch.Tensor, hidden: bool, **forward_kwargs: Any
) -> ModelOutput:
    """One causal forward of right-padded ``tokens [B, N]`` in a fresh cache (padding only follows real tokens);
    ``forward_kwargs`` go to :meth:`LanguageModel.forward` (e.g. ``exit_layer``)."""
    cache = model.new_cache(tokens.shape[0], tokens.shape[1])
    view = cache.stage(tokens.shape[1])
    mask, positions = chain_mask(cache.lengths, tokens.shape[1], view.kv_len)
    return model.forward(tokens, positions, mask, view, logits_at=logits_at, return_hidden=hidden, **forward_kwargs)


@torch.no_grad()
def label_batch(
    target: LanguageModel,
    draft: LanguageModel,
    prompts: Sequence[list[int]],
    max_new_tokens: int,
    mixing: float,
    generator: torch.Generator,
) -> dict[str, np.ndarray]:
    """Rows for one batch of prompts: ``hidden [R, H]`` (float16), ``label [R]``, ``sampled [R]`` (bool: the
    temperature-1 label, else the greedy one), ``row [R]`` (index in ``prompts``); plus ``tokens`` (response
    tokens written)."""
    out = dk.generate(target, list(prompts), max_new_tokens=max_new_tokens)
    plen = torch.tensor([len(p) for p in prompts])
    rlen = torch.tensor([len(s) for s in out.sequences])
    width, steps = int((plen + rlen).max()), int(rlen.max())
    tokens = torch.zeros(len(prompts), width, dtype=torch.long)
    for b, (p, s) in enumerate(zip(prompts, out.sequences)):
        tokens[b, : len(p) + len(s)] = torch.tensor(p + s)
    t = torch.arange(steps)
    valid = t < rlen[:, None]  # [B, T]
    at = (plen[:, None] - 1 + t).clamp(max=width - 1)  # the input position whose logits predict response token t
    logp = _forward(target, tokens, at, False).logits.float().log_softmax(-1)  # [B, T, V]
    logq = _forward(draft, tokens, at, False).logits.float().log_softmax(-1)
    greedy = logq.argmax(-1)
    greedy_label = (greedy == logp.argmax(-1)).float()
    sampled = torch.multinomial(logq.exp().flatten(0, 1), 1, generator=generator).view_as(greedy)
    ratio = logp.gather(-1, sampled[..., None]) - logq.gather(-1, sampled[..., None])
    sampled_label = ratio[..., 0].clamp(max=0).exp()
    keep = valid & (torch.rand(valid.shape, generator=generator) >= mixing)  # mixed-in target tokens: unlabelled
    response = tokens.gather(1, (plen[:, None] + t).clamp(max=width - 1))  # [B, T] X_t
    rows: dict[str, list[Any]] = {"hidden": [], "label": [], "sampled": [], "row": []}
    pos = (plen[:, None] + t).clamp(max=width - 1)  # response token t's position
    rows_idx = valid.nonzero(as_tuple=True)[0]
    for is_sampled, z, label in ((False, greedy, greedy_label), (True, sampled, sampled_label)):
        mixed = tokens.clone()
        mixed[rows_idx, pos[valid]] = torch.where(keep, z, response)[valid]
        last = _forward(draft, mixed, torch.zeros(len(prompts), 1, dtype=torch.long), True).last_hidden
        hidden = last.gather(1, pos[..., None].expand(-1, -1, last.shape[-1]))  # [B, T, H] at Z_t's position
        rows["hidden"].append(hidden[keep].half().numpy())
        rows["label"].append(label[keep].numpy())
        rows["sampled"].append(np.full(int(keep.sum()), is_sampled))
        rows["row"].append(keep.nonzero()[:, 0].numpy())
    data = {k: np.concatenate(v) for k, v in rows.items()}
    data["tokens"] = np.array(int(rlen.sum()))
    return data


def generate_dataset(
    target: LanguageModel,
    draft: LanguageModel,
    prompts: Sequence[list[int]],
    data_dir: Path,
    *,
    max_new_tokens: int,
    batch_size: int,
    shard_size: int,
    mixing: float,
    seed: int,
    progress: bool = True,
) -> tuple[Any, int, float]:
    """Label ``prompts`` into a :class:`datasets.Dataset` (columns ``hidden``, ``label``, ``sampled``, ``prompt``)
    saved in shards of ``shard_size`` prompts under ``data_dir``; shards already there are reused (resume).
    Returns the dataset, the number of response tokens the target wrote and the seconds its shards took to make
    (also those made by an earlier run)."""
    from datasets import Dataset, concatenate_datasets, load_from_disk

    shards, tokens, seconds = [], 0, 0.0
    starts = range(0, len(prompts), shard_size)
    bar = tqdm(total=len(prompts), desc="labelling prompts", unit="prompt", disable=not progress)
    for index, start in enumerate(starts):
        path = data_dir / f"shard_{index:05d}"
        if not (path / "dataset_info.json").is_file():
            began = time.perf_counter()
            generator = torch.Generator().manual_seed(seed * 1_000_003 + index)
            parts = []
            chunk = prompts[start : start + shard_size]
            for b in range(0, len(chunk), batch_size):
                part = label_batch(target, draft, chunk[b : b + batch_size], max_new_tokens, mixing, generator)
                part["prompt"] = (part.pop("row") + start + b).astype(np.int32)
                parts.append(part)
                bar.update(len(chunk[b : b + batch_size]))
            columns = {k: np.concatenate([p[k] for p in parts]) for k in ("hidden", "label", "sampled", "prompt")}
            shard = Dataset.from_dict(columns)
            written = sum(int(p["tokens"]) for p in parts)  # response tokens in this shard, and the time they took
            shard.info.description = json.dumps({"tokens": written, "seconds": time.perf_counter() - began})
            shard.save_to_disk(str(path))
        else:
            bar.update(len(prompts[start : start + shard_size]))
        shard = load_from_disk(str(path))
        info = json.loads(shard.info.description)
        tokens, seconds = tokens + info["tokens"], seconds + info["seconds"]
        shards.append(shard)
    bar.close()
    return concatenate_datasets(shards), tokens, seconds
