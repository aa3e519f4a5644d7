"""The diffusion-LM benchmark's measures and tables (:mod:`decodekit.bench.dlm`).

Reported per method:

* ``nfe`` (forwards per prompt), ``tokens_per_forward``, wall time and ``speedup`` (the base's wall time over the
  method's, summed over the prompts);
* ``agreement``: the fraction of generated tokens equal to the base sampler's at the same slot; ``vs_uncached``: for
  a method with a cache strategy and ``uncached: <method>`` in its spec, the same fraction against that method (the
  same rule without the cache): what the cache alone changes;
* ``similarity``: difflib's ratio between each output and the base's as token sequences (``2 M / (|a| + |b|)``, ``M``
  the tokens matched in order), averaged over the prompts. One shifted or dropped token makes every later slot
  disagree but keeps most of the similarity, so the two columns together tell a late local slip from a different text;
* ``ar_nll``: the mean negative log-likelihood per generated token under the autoregressive base model (the
  zoo's SmolLM2), a perplexity proxy for fluency: lower is better, compare with the base sampler's row;
* ``parses``: for code prompts, the fraction whose prompt + completion, cut after its last complete line, is valid
  Python (``ast.parse``).
"""

from __future__ import annotations

import ast
from typing import Any

import torch

COLUMNS = (
    "method",
    "steps",
    "nfe",
    "tokens_per_forward",
    "wall_s",
    "speedup",
    "agreement",
    "similarity",
    "vs_uncached",
    "ar_nll",
    "parses",
)


def method_row(name: str, gen: int, outs: list[Any], base: list[Any], prompts, texts, code, dlm, ar) -> dict[str, Any]:
    tokens = [o.sequences[0] for o in outs]
    wall, base_wall = sum(o.stats.wall_time_s for o in outs), sum(o.stats.wall_time_s for o in base)
    parsed = [_parses(text, dlm.tokenizer.decode(t)) for text, t, c in zip(texts, tokens, code) if c]
    return {
        "method": name,
        "gen_length": gen,
        "nfe": sum(o.stats.nfe for o in outs) / len(outs),
        "tokens_per_forward": sum(len(t) for t in tokens) / max(sum(o.stats.nfe for o in outs), 1),
        "wall_s": wall,
        "speedup": base_wall / wall if wall > 0 else None,
        "agreement": agreement(outs, base),
        "similarity": similarity([o.sequences[0] for o in outs], [b.sequences[0] for b in base]),
        "ar_nll": ar_nll(ar, prompts, tokens),
        "parses": sum(parsed) / len(parsed) if parsed else None,
    }


def synthetic_markdown(rows: list[dict[str, Any]]) -> str:
    from decodekit.dlm.synthetic import TASKS

    methods = list(dict.fromkeys(r["method"] for r in rows))
    cell = {(r["method"], r["task"]): r for r in rows}
    lines = ["**Synthetic tasks** (accuracy; forwards per item)", ""]
    lines += ["| method | " + " | ".join(TASKS) + " |", "|---" * (len(TASKS) + 1) + "|"]
    for m in methods:
        cells = [cell[m, t] for t in TASKS]
        lines.append(
            f"| {m} | "
            + " | ".join(_fmt(c["accuracy"]) + ("" if c["nfe"] is None else f" ({c['nfe']:.1f})") for c in cells)
            + " |"
        )
    return "\n".join(lines) + "\n"


def agreement(outs: list[Any], reference: list[Any]) -> float:
    """The fraction of generated tokens equal to the reference run's at the same slot (one-row outputs)."""
    same = sum(sum(a == b for a, b in zip(o.sequences[0], r.sequences[0])) for o, r in zip(outs, reference))
    return same / max(sum(len(o.sequences[0]) for o in outs), 1)


def similarity(outputs: list[list[int]], references: list[list[int]]) -> float:
    """Mean over the pairs of difflib's ratio of the two token sequences: ``2 M / (|a| + |b|)``, ``M`` the tokens of
    their longest matching blocks in order (1.0 identical, 0.0 nothing in common)."""
    from difflib import SequenceMatcher

    ratios = [SequenceMatcher(a=r, b=o, autojunk=False).ratio() for o, r in zip(outputs, references)]
    return sum(ratios) / max(len(ratios), 1)


@torch.no_grad()
def ar_nll(model: Any, prompts: list[list[int]], outputs: list[list[int]]) -> float:
    """Mean negative log-likelihood per output token under the autoregressive ``model`` (each prompt + output
    scored alone, causally)."""
    total, count = 0.0, 0
    for prompt, output in zip(prompts, outputs):
        ids = torch.tensor([prompt + output], device=model.device)
        logits = model.hf(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()
        total += float(torch.nn.functional.cross_entropy(logits, ids[0, len(prompt) :], reduction="sum"))
        count += len(output)
    return total / max(count, 1)


def _parses(prompt: str, completion: str) -> bool:
    """Whether prompt + completion up to its last complete line is valid Python."""
    text = prompt + completion
    cut = text.rfind("\n")
    try:
        ast.parse(text[: cut + 1] if cut >= len(prompt) else text)
    except (SyntaxError, ValueError):
        return False
    return True


def markdown(results: list[dict[str, Any]]) -> str:
    lines = []
    for gen in sorted({r["gen_length"] for r in results}):
        lines += [f"**G = {gen}**", "", "| " + " | ".join(COLUMNS) + " |", "|---" * len(COLUMNS) + "|"]
        for r in (r for r in results if r["gen_length"] == gen):
            cells = [_fmt(r[c]) for c in COLUMNS]
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
        lines += [f"- `{r['method']}`: {w}" for r in results if r["gen_length"] == gen for w in r.get("warnings", ())]
    return "\n".join(lines)


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.2f}"
    return str(value)
