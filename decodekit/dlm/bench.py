"""The diffusion-LM benchmark (``python -m decodekit dlm-bench``, ``decodekit/recipes/dlm_bench.yaml``): every
sampler and cache against the base sampler, speed next to what it cost in quality.

Protocol, per generation length ``G``: the base sampler (LLaDA's rule, one token per step: ``steps = G``) and each
method run on the same prompts (one warm-up call first), interleaved prompt by prompt so machine drift lands on all
alike. Reported per method:

* ``nfe`` (forwards per prompt), ``tokens_per_forward``, wall time and ``speedup`` (the base's wall time over the
  method's, summed over the prompts);
* ``agreement``: the fraction of generated tokens equal to the base sampler's at the same slot;
* ``ar_nll``: the mean negative log-likelihood per generated token under the autoregressive base model (the
  zoo's SmolLM2), a perplexity proxy for fluency: lower is better, compare with the base sampler's row;
* ``parses``: for code prompts, the fraction whose prompt + completion, cut after its last complete line, is valid
  Python (``ast.parse``).
"""

from __future__ import annotations

import ast
import json
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from decodekit.checks import check_int

COLUMNS = ("method", "steps", "nfe", "tokens_per_forward", "wall_s", "speedup", "agreement", "ar_nll", "parses")


def run(
    out_dir: str | Path,
    *,
    model: Any = "smollm2-135m-dlm",
    scorer: Any = "smollm2-135m-instruct",
    task: str = "humaneval",
    num_prompts: int = 8,
    max_prompt_tokens: int = 384,
    gen_lengths: tuple[int, ...] | list[int] = (128,),
    block_length: int = 32,
    methods: dict[str, dict[str, Any]] | None = None,
    seed: int = 0,
    progress: bool = True,
) -> str:
    """Run the benchmark; write ``results.json`` and ``results.md`` to ``out_dir``; return the markdown.

    Args:
        model: the diffusion LM (:func:`decodekit.dlm.load_model` spec). scorer: the autoregressive model that scores
            the outputs (``ar_nll``). task: a prompt set of :func:`decodekit.bench.tasks.load_task`.
        gen_lengths, block_length: generation lengths to run, and the block length.
        methods: name -> ``{rule: <dlm_rule object or None>, cache: <dlm_cache object or None>, tokens_per_step:
            <int, default 1: steps = G / tokens_per_step>}``, already built (the recipe instantiates them).
    """
    import decodekit as dk
    from decodekit.bench.tasks import load_task

    check_int("num_prompts", num_prompts, low=1)
    dlm = dk.dlm.load_model(model)
    ar = dk.load_model(scorer)
    rows = load_task(task, dlm.tokenizer, num_prompts=num_prompts, max_prompt_tokens=max_prompt_tokens, seed=seed)
    prompts, texts = [list(r["input_ids"]) for r in rows], [r["prompt"] for r in rows]
    code = [r.get("category") == "code" for r in rows]
    results: list[dict[str, Any]] = []
    for gen in gen_lengths:
        plan = {"base": {"rule": None, "cache": None}, **(methods or {})}
        steps = {name: gen // int(spec.get("tokens_per_step") or 1) for name, spec in plan.items()}
        runs: dict[str, list[Any]] = {name: [] for name in plan}
        bar = tqdm(total=len(plan) * (len(prompts) + 1), desc=f"dlm-bench G={gen}", disable=not progress)
        for i, prompt in enumerate([prompts[0], *prompts]):  # the first call of each method warms up
            for name, spec in plan.items():
                kwargs = dict(
                    gen_length=gen,
                    block_length=min(block_length, gen),
                    steps=steps[name],
                    rule=spec.get("rule"),
                    cache=spec.get("cache"),
                    seed=[seed],
                )
                out = dk.dlm.generate(dlm, [prompt], **kwargs)
                if i:
                    runs[name].append(out)
                bar.update()
        bar.close()
        base = runs["base"]
        for name, outs in runs.items():
            results.append({**_row(name, gen, outs, base, prompts, texts, code, dlm, ar), "steps": steps[name]})
    table = _markdown(results)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=1))
    (out / "results.md").write_text(table)
    return table


def _row(name: str, gen: int, outs: list[Any], base: list[Any], prompts, texts, code, dlm, ar) -> dict[str, Any]:
    tokens = [o.sequences[0] for o in outs]
    wall, base_wall = sum(o.stats.wall_time_s for o in outs), sum(o.stats.wall_time_s for o in base)
    agree = sum(sum(a == b for a, b in zip(t, o.sequences[0])) for t, o in zip(tokens, base))
    parsed = [_parses(text, dlm.tokenizer.decode(t)) for text, t, c in zip(texts, tokens, code) if c]
    return {
        "method": name,
        "gen_length": gen,
        "nfe": sum(o.stats.nfe for o in outs) / len(outs),
        "tokens_per_forward": sum(len(t) for t in tokens) / max(sum(o.stats.nfe for o in outs), 1),
        "wall_s": wall,
        "speedup": base_wall / wall if wall > 0 else None,
        "agreement": agree / max(sum(len(t) for t in tokens), 1),
        "ar_nll": ar_nll(ar, prompts, tokens),
        "parses": sum(parsed) / len(parsed) if parsed else None,
    }


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


def _markdown(results: list[dict[str, Any]]) -> str:
    lines = []
    for gen in sorted({r["gen_length"] for r in results}):
        lines += [f"**G = {gen}**", "", "| " + " | ".join(COLUMNS) + " |", "|---" * len(COLUMNS) + "|"]
        for r in (r for r in results if r["gen_length"] == gen):
            cells = [_fmt(r[c]) for c in COLUMNS]
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.2f}"
    return str(value)


__all__ = ["ar_nll", "run"]
