"""Run methods over a prompt set and collect comparable measurements that hold on a shared machine.

Protocol, for every (sampling setting, batch size): the first method is the reference (autoregressive decoding);
every method gets one untimed warm-up call (first batch, 16 new tokens). Then ``passes`` timed passes: in each, for
each batch of prompts, every method runs back to back on that batch, in an order rotated from batch to batch and
pass to pass, so slow drifts of the machine land on all methods alike; a call during which other processes used
more than 10% of our CPUs is re-run, up to ``reruns`` times (3 by default; :mod:`decodekit.bench.load`), since one
burst can slow one call several-fold. Speedups are ratios within a pass (never between passes): the median over
passes, with their min-max spread. Every timed call is kept (:class:`Call`, in ``results.json``). Reported per method:

* tokens/s end to end and for decoding alone (prefill, i.e. time to the first token, reported separately), from the
  median pass;
* ``speedup``: decode tokens/s over the reference's in the same pass (median, and ``speedup_range``);
* mean acceptance length, per-position acceptance rate, draft / verify / other time (the median pass's);
* ``zero_overhead``: the speedup the measured acceptance and measured draft + verify costs would give if the loop's
  own bookkeeping cost nothing (tokens committed per second of draft + verify time over the reference's tokens per
  second of forward time; ``policies.md`` section 0 with every term measured). It is the speedup minus the
  loop's overhead, not an upper bound over drafters; ``ceiling`` is the same with every drafted token accepted (a
  tree's deepest path: a round accepts one path at most);
* ``greedy_match``: at temperature 0, the fraction of prompts whose output equals the reference's, so a speedup
  is never reported for different output; ``greedy_diffs`` explains each prompt that differs (the first differing
  token and the target's top-2 margin there, :func:`decodekit.spec.diagnostics.first_divergence`), so a floating-point
  near-tie is told apart from a bug. The diagnostics run after all timing;
* ``warnings``: a wide spread across passes, calls still disturbed after their re-runs (the machine was busy),
  and decodekit's autoregressive loop slower than transformers' ``generate`` by more than 10%.

At temperature 0 every result also gets ``lookup_bound``: the tokens a forward of the best drafter that copies its
drafts from the prompt and output so far, at draft depths 4, 8 and 16 (:mod:`decodekit.bench.lookup_bound`), which
the model-free drafters' tokens a forward are read against.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

from tqdm.auto import tqdm

from decodekit.bench.distributed import World, current_world, merge, place
from decodekit.bench.greedy_diff import greedy_diffs
from decodekit.bench.load import RETRIES, least_disturbed
from decodekit.bench.lookup_bound import DEPTHS as LOOKUP_DEPTHS
from decodekit.bench.lookup_bound import lookup_tokens_per_forward
from decodekit.bench.methods import Method, Run, Setting, TransformersBaseline
from decodekit.bench.results import Call, Result, aggregate
from decodekit.checks import check_int
from decodekit.errors import ConfigError
from decodekit.models import LanguageModel

WARMUP_TOKENS = 16


def run_benchmark(
    model: LanguageModel,
    prompts: Sequence[list[int]],
    methods: Sequence[Method | TransformersBaseline],
    *,
    settings: Sequence[Setting] = (Setting(name="greedy"),),
    batch_sizes: Sequence[int] = (1,),
    max_new_tokens: int = 128,
    seed: int = 0,
    passes: int = 3,
    progress: bool = True,
    prompt_ids: Sequence[int | str] | None = None,
    reruns: int = RETRIES,
) -> list[Result]:
    """Measure every method on ``prompts`` for every setting and batch size, interleaved over ``passes`` passes
    (see the module docstring); the first method is the reference.

    Methods that cannot run a batch size (transformers' assisted generation above 1) are skipped there.
    ``prompt_ids`` (e.g. a task's ``id`` column) name the prompts in ``greedy_diffs``; default: their indices.
    ``reruns``: how often a timed call that other processes' load disturbed is re-run (0: never, e.g. where the
    output is what matters, not the times).
    Launched as several processes (``accelerate launch``), each runs its share of the batches on its own device
    and every process returns the merged results (:mod:`decodekit.bench.distributed`).
    """
    passes = check_int("passes", passes, low=1)
    reruns = check_int("reruns", reruns, low=0)
    world = current_world()
    place(world, model, methods)
    prompts = [list(p) for p in prompts]
    ids = list(prompt_ids) if prompt_ids is not None else list(range(len(prompts)))
    if len(ids) != len(prompts):
        raise ConfigError(f"got {len(ids)} prompt ids for {len(prompts)} prompts")
    units = sum(
        (1 + passes * len(world.share(len(_batches(prompts, b))))) * sum(_fits(m, b) for m in methods)
        for _ in settings
        for b in batch_sizes
    )
    bar = tqdm(total=units, desc="benchmark", disable=not (progress and world.main), unit="call")
    results = []
    for setting in settings:
        for batch_size in batch_sizes:
            fitting = [m for m in methods if _fits(m, batch_size)]
            measured = _measure(
                model, prompts, fitting, setting, batch_size, max_new_tokens, seed, passes, reruns, bar, world
            )
            group = aggregate(fitting, *merge(world, *measured), setting, batch_size, len(prompts))
            if setting.greedy and group:
                bound = {d: lookup_tokens_per_forward(prompts, group[0].sequences, d) for d in LOOKUP_DEPTHS}
                for result in group:
                    result.lookup_bound = bound
            results += group
    bar.close()
    for result in results:
        if result.greedy_match is not None and result.greedy_match < 1:
            reference = next(r for r in results if (r.setting, r.batch_size) == (result.setting, result.batch_size))
            rows = world.mine(prompts, ids, reference.sequences, result.sequences)  # each process its share
            result.greedy_diffs = world.concat(greedy_diffs(model, *rows))
    return results


def _fits(method: Method | TransformersBaseline, batch_size: int) -> bool:
    return method.max_batch is None or batch_size <= method.max_batch


def _batches(prompts: list[list[int]], batch_size: int) -> list[list[list[int]]]:
    return [prompts[i : i + batch_size] for i in range(0, len(prompts), batch_size)]


def _measure(
    model: LanguageModel,
    prompts: list[list[int]],
    methods: list[Method | TransformersBaseline],
    setting: Setting,
    batch_size: int,
    max_new_tokens: int,
    seed: int,
    passes: int,
    reruns: int,
    bar: tqdm,
    world: World,
) -> tuple[list[list[list[Run]]], list[list[Call]]]:
    """Warm every method up, then time them interleaved: per pass, per batch, all methods back to back in a
    rotated order. Returns each method's runs ``[method][pass][batch]`` and its timed calls ``[method][call]``.
    Several processes run their shares of the batches, each pass started together; seeds and rotation follow the
    batch's index in the whole set, so a batch runs as it would in a single process."""
    batches = _batches(prompts, batch_size)
    mine = world.share(len(batches))
    for method in methods:
        bar.set_postfix_str(f"{setting.name} b={batch_size} warm-up {method.name}")
        if mine:  # lazy init, on this process's first batch
            method.generate(model, batches[mine[0]], setting, min(max_new_tokens, WARMUP_TOKENS), seed)
        bar.update()
    runs: list[list[list[Run]]] = [[[] for _ in range(passes)] for _ in methods]
    calls: list[list[Call]] = [[] for _ in methods]
    for p in range(passes):
        world.barrier()
        for i in mine:
            batch = batches[i]
            shift = (p * len(batches) + i) % len(methods)
            for order, m in enumerate([*range(shift, len(methods)), *range(shift)]):
                method = methods[m]
                bar.set_postfix_str(f"{setting.name} b={batch_size} pass {p + 1}/{passes} {method.name}")
                call = functools.partial(method.generate, model, batch, setting, max_new_tokens, seed + i)
                run, others, attempts = least_disturbed(call, reruns) if world.size == 1 else (call(), None, 1)
                runs[m][p].append(run)
                tokens = sum(len(s) for s in run.sequences)
                where = (setting.name, batch_size, method.name, p, i, order)
                calls[m].append(
                    Call(*where, len(batch), tokens, run.wall_s, run.prefill_s, world.rank, others, attempts)
                )
                bar.update()
    return runs, calls
