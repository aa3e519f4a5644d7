"""The diffusion-LM benchmark (``python -m decodekit dlm-bench``, ``decodekit/recipes/dlm_bench/dlm_bench.yaml``): every
sampler and cache against the base sampler, speed next to what it cost in quality.

Protocol, per generation length ``G``: the base sampler (LLaDA's rule, one token per step: ``steps = G``) and each
method run on the same prompts (one warm-up call first), interleaved prompt by prompt so machine drift lands on all
alike. Reported per method: the columns of :mod:`decodekit.bench.dlm_report`.

A second table runs the synthetic tasks of :mod:`decodekit.dlm.synthetic` (copy, reverse, sort, join words), where
parallel commits are known to break, for the same methods and for the autoregressive scorer (greedy; the reference
the adapted model started from): accuracy per task and forwards per item.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from decodekit.bench.dlm_methods import check_gen_lengths, check_steps, method_spec, steps_of
from decodekit.bench.dlm_report import agreement, ar_nll, markdown, method_row, similarity, synthetic_markdown
from decodekit.bench.load import RETRIES, disturbed_warning, least_disturbed
from decodekit.bench.machine import machine_info
from decodekit.checks import check_bool, check_choice, check_int, describe, parse_device
from decodekit.dlm.synthetic import STYLES
from decodekit.errors import ConfigError, ConfigTypeError


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
    base: dict[str, Any] | None = None,
    only: list[str] | None = None,
    seed: int = 0,
    synthetic: int = 8,
    synthetic_length: int = 32,
    synthetic_style: str = "lines",
    synthetic_shots: int = 4,
    progress: bool = True,
    device: str | None = None,
    kernels: str | None = None,
    reruns: int = RETRIES,
) -> str:
    """Run the benchmark; write ``results.json`` and ``results.md`` to ``out_dir``; return the markdown.

    Args:
        model: the diffusion LM (:func:`decodekit.dlm.load_model` spec). scorer: the autoregressive model that scores
            the outputs (``ar_nll``). task: a prompt set of :func:`decodekit.bench.tasks.load_task`.
        gen_lengths, block_length: generation lengths to run, and the block length.
        methods: name -> ``{rule: <dlm_rule object or None>, cache: <dlm_cache object or None>, schedule:
            <dlm_schedule object or None>, draft: <dlm_draft object or None>, tokens_per_step: <int, default 1:
            steps = G / tokens_per_step>, uncached:
            <the name of the same method without its cache, for vs_uncached>, compile: <dk.dlm.generate's
            compile=, default False; the warm-up call compiles>}``, already built (the recipe instantiates them).
        base: the reference sampler's spec, as a method's (``rule`` must stay LLaDA's: None); default the uncached
            base. A cache that equals the uncached base token for token may stand in to save time: the exact
            ``BlockCausalCache`` on a block-causal model (at G = 256 the recompute takes ~15 min a prompt on 2 CPU
            cores). Every ``agreement`` and ``speedup`` is then against that run.
        only: run just these of ``methods`` (None = every enabled one): a protocol names what it runs instead of
            switching the others off one by one, so a method added to the recipe later does not join it.
        synthetic, synthetic_length: items per synthetic task (0 = skip that table) and their generation length
            (one block). synthetic_style: their prompts, ``"lines"`` (few-shot Python lines) or ``"chat"`` (few-shot
            chat turns through the model's chat template: for a DLM trained on chat responses). synthetic_shots:
            the solved examples before each item (fewer: shorter prompts, cheaper forwards).
        device: where the diffusion LM and the scorer run (``"cuda"``; None = the CPU).
        kernels: CPU linear kernels for both models (``"onednn"``, the recipe's default: prepacked linears,
            :mod:`decodekit.kernels.cpu`, faster forwards with the same tokens in docs/benchmarks.md's runs);
            None = stock. Not used when ``device`` is a GPU.
        reruns: re-runs of a timed call during which other processes used more than 10% of the CPUs, the least
            disturbed kept (:mod:`decodekit.bench.load`, as the bench does); a method still disturbed is named under
            the table. ``results.json`` also records the machine and these settings.
    """
    settings = {k: v for k, v in locals().items() if k not in ("out_dir", "methods", "base")}
    import decodekit as dk
    from decodekit.bench.tasks import TASKS, load_task
    from decodekit.dlm.parts import refusal
    from decodekit.kernels.cpu import check_kernels

    check_int("num_prompts", num_prompts, low=1)
    check_int("max_prompt_tokens", max_prompt_tokens, low=1)
    check_int("seed", seed)
    check_int("synthetic", synthetic, low=0, hint=" (items per synthetic task; 0 = skip them)")
    check_int("synthetic_length", synthetic_length, low=1)
    check_choice("synthetic_style", synthetic_style, STYLES)
    check_int("synthetic_shots", synthetic_shots, low=0, hint=" (solved examples before each synthetic item)")
    progress = check_bool("progress", progress)
    reruns = check_int("reruns", reruns, low=0, hint=" (re-runs of a timed call other processes disturbed)")
    block_length = check_int("block_length", block_length, low=1)
    gen_lengths = check_gen_lengths(gen_lengths, block_length)
    if device is not None and parse_device("device", device).type != "cpu":
        kernels = None  # CPU kernels: a GPU run keeps its own
    kernels = check_kernels(kernels)
    base = {"rule": None, "cache": None} if base is None else dict(method_spec("base", base))
    if only is not None and (isinstance(only, str) or not isinstance(only, Sequence)):
        raise ConfigTypeError(f"only must be None or a list of method names, got {describe(only)}")
    if methods is not None and not isinstance(methods, Mapping):
        raise ConfigTypeError(f"methods must be a mapping of method names to specs, got {describe(methods)}")
    # the synthetic tasks are one block (on a block-causal model its own blocks: checked once it loaded)
    lengths = [("gen_lengths", g, min(block_length, g)) for g in gen_lengths]
    lengths += [("synthetic_length", synthetic_length, synthetic_length)] if synthetic else []
    for name, spec in {"base": base, **{f"methods.{k}": v for k, v in (methods or {}).items()}}.items():
        if spec is not None:
            check_steps(name, method_spec(name, spec), lengths)
    check_choice("task", task, TASKS)
    if base.get("rule") is not None or int(base.get("tokens_per_step") or 1) != 1 or base.get("uncached"):
        raise ConfigError(
            "base must be LLaDA's rule at one token per step (rule: null, no tokens_per_step or uncached); set only "
            "its cache (an exact one, e.g. BlockCausalCache on a block-causal model) or schedule, and put other "
            "samplers under methods"
        )
    enabled = {name: spec for name, spec in (methods or {}).items() if spec is not None}  # methods.<name>=null: off
    if only is not None:
        if unknown := [name for name in only if name not in enabled]:
            raise ConfigError(f"only names {unknown}, which are not enabled methods; enabled: {sorted(enabled)}")
        enabled = {name: enabled[name] for name in only}
    for name, spec in enabled.items():
        if spec.get("uncached") is not None and spec["uncached"] not in enabled:
            raise ConfigError(
                f"methods.{name}.uncached names {spec['uncached']!r}, which is not an enabled method: enable it, or "
                f"drop the reference (methods.{name}.uncached=null)"
            )
    dlm = dk.dlm.load_model(model, device=device, kernels=kernels)
    if synthetic and dlm.block_length:  # the synthetic tasks run on the model's own blocks: known once it loaded
        block = min(synthetic_length, dlm.block_length)
        if synthetic_length % block:
            raise ConfigError(
                f"synthetic_length={synthetic_length} is not a whole number of this model's blocks of {block} (it was "
                "trained block-causally): use a multiple of it"
            )
        for name, spec in [("base", base), *((f"methods.{k}", v) for k, v in enabled.items())]:
            check_steps(name, spec, [("synthetic_length", synthetic_length, block)])
    ar = dk.load_model(scorer, device=device, kernels=kernels)
    rows = load_task(task, dlm.tokenizer, num_prompts=num_prompts, max_prompt_tokens=max_prompt_tokens, seed=seed)
    prompts, texts = [list(r["input_ids"]) for r in rows], [r["prompt"] for r in rows]
    code = [r.get("category") == "code" for r in rows]
    results: list[dict[str, Any]] = []
    synth: list[dict[str, Any]] = []
    folder = Path(out_dir)
    folder.mkdir(parents=True, exist_ok=True)

    def save() -> str:  # after every section: a long run stopped midway keeps what it measured
        table = markdown(results) + ("\n" + synthetic_markdown(synth) if synth else "")
        table += "".join(f"\n- `{name}` not run, refused by this model: {why}" for name, why in refused.items())
        payload = {"methods": results, "synthetic": synth, "refused": refused, "machine": machine, "config": config}
        (folder / "results.json").write_text(json.dumps(payload, indent=1, default=_plain))
        (folder / "results.md").write_text(table)
        return table

    if why := refusal(dlm, base, block_length):
        raise ConfigError(f"the base sampler cannot run on this model: {why}")
    refused = {name: why for name, spec in enabled.items() if (why := refusal(dlm, spec, block_length))}
    machine, config = (
        machine_info(dlm.lm),
        {**settings, "base": repr(base), "methods": {k: repr(v) for k, v in enabled.items()}},
    )
    plan = {"base": base, **{k: v for k, v in enabled.items() if k not in refused}}
    for name, spec in plan.items():
        if spec.get("uncached") in refused:  # its reference cannot run on this model: no vs_uncached column
            plan[name] = {**spec, "uncached": None}
    for gen in gen_lengths:
        steps = {name: steps_of(spec, gen) for name, spec in plan.items()}
        runs: dict[str, list[Any]] = {name: [] for name in plan}
        shares: dict[str, list[float | None]] = {name: [] for name in plan}  # others' CPU share in each timed call
        bar = tqdm(total=len(plan) * (len(prompts) + 1), desc=f"dlm-bench G={gen}", disable=not progress)
        for i, prompt in enumerate([prompts[0], *prompts]):  # the first call of each method warms up
            for name, spec in plan.items():
                call = functools.partial(_generate, dlm, [prompt], spec, gen, min(block_length, gen), seed)
                out, share, _ = least_disturbed(call, reruns) if i else (call(), None, 1)
                if i:
                    runs[name].append(out)
                    shares[name].append(share)
                bar.update()
        bar.close()
        for name, outs in runs.items():
            row = method_row(name, gen, outs, runs["base"], prompts, texts, code, dlm, ar)
            uncached = plan[name].get("uncached")
            row["vs_uncached"] = agreement(outs, runs[uncached]) if uncached else None
            row["warnings"] = disturbed_warning(shares[name], reruns)
            results.append({**row, "steps": steps[name]})
        save()
    if synthetic:
        synth = run_synthetic(
            dlm, ar, plan, synthetic, synthetic_length, seed, progress, synthetic_style, synthetic_shots
        )
    return save()


def _plain(value: Any) -> Any:
    """JSON for what ``json`` does not take: a config's list as a list, anything else as its ``repr``."""
    return list(value) if isinstance(value, Sequence) and not isinstance(value, (str, bytes)) else repr(value)


def _generate(dlm: Any, prompts: list[list[int]], spec: dict[str, Any], gen: int, block: int, seed: int) -> Any:
    """One :func:`decodekit.dlm.generate` call of a method ``spec``, every row seeded with ``seed``."""
    import decodekit as dk

    return dk.dlm.generate(
        dlm, prompts, gen_length=gen, block_length=block, steps=steps_of(spec, gen), rule=spec.get("rule"),
        cache=spec.get("cache"), schedule=spec.get("schedule"), draft=spec.get("draft"), seed=[seed] * len(prompts),
        compile=spec.get("compile") or False,
    )  # fmt: skip


def run_synthetic(
    dlm: Any,
    ar: Any,
    plan: dict[str, dict[str, Any]],
    count: int,
    gen: int,
    seed: int,
    progress: bool = True,
    style: str = "lines",
    shots: int = 4,
) -> list[dict[str, Any]]:
    """Accuracy of every method (and of ``ar``, greedy) on ``count`` items of each synthetic task in ``style``, with
    ``shots`` solved examples each (:func:`~decodekit.dlm.synthetic.make_items`), one batched call per task and
    method: ``[{method, task, accuracy, nfe}]`` (``nfe``: forwards per item; ``None`` for ``ar``). Completions are
    decoded without special tokens, so an answer followed by the end-of-text token counts."""
    import decodekit as dk
    from decodekit.dlm.synthetic import TASKS, accuracy, make_items

    rows = []
    bar = tqdm(total=len(TASKS) * (len(plan) + 1), desc=f"dlm-bench synthetic G={gen}", disable=not progress)
    for task in TASKS:
        items = make_items(task, count, seed=seed, shots=shots, style=style, tokenizer=dlm.tokenizer)
        prompts = [dlm.tokenizer(i.prompt, add_special_tokens=False)["input_ids"] for i in items]
        for name, spec in plan.items():
            out = _generate(dlm, prompts, spec, gen, min(gen, dlm.block_length or gen), seed)
            ok = accuracy(items, [dlm.tokenizer.decode(t, skip_special_tokens=True) for t in out.sequences])
            rows.append({"method": name, "task": task, "accuracy": ok, "nfe": sum(out.stats.row_nfe) / count})
            bar.update()
        plain = dk.generate(ar, prompts, max_new_tokens=gen, temperature=0.0)
        ok = accuracy(items, [ar.tokenizer.decode(t, skip_special_tokens=True) for t in plain.sequences])
        rows.append({"method": "autoregressive", "task": task, "accuracy": ok, "nfe": None})
        bar.update()
    bar.close()
    return rows


__all__ = ["ar_nll", "run", "run_synthetic", "similarity"]
