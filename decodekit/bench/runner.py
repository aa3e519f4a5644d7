"""Run methods over a prompt set and collect comparable measurements that hold on a shared machine.

Protocol, for every (sampling setting, batch size): the first method is the reference (autoregressive decoding);
every method gets one untimed warm-up call (first batch, 16 new tokens). Then ``passes`` timed passes: in each, for
each batch of prompts, every method runs back to back on that batch, in an order rotated from batch to batch and
pass to pass, so slow drifts of the machine land on all methods alike; a call during which other processes used
more than 10% of our CPUs is re-run, up to 3 times (:mod:`decodekit.bench.load`), since one burst can slow one call
several-fold. Speedups are ratios within a pass (never between passes): the median over passes, with their
min-max spread. Every timed call is kept (:class:`Call`, in ``results.json``). Reported per method:

* tokens/s end to end and for decoding alone (prefill, i.e. time to the first token, reported separately), from the
  median pass;
* ``speedup``: decode tokens/s over the reference's in the same pass (median, and ``speedup_range``);
* mean acceptance length, per-position acceptance rate, draft / verify / other time (the median pass's);
* ``zero_overhead``: the speedup the measured acceptance and measured draft + verify costs would give if the loop's
  own bookkeeping cost nothing (tokens committed per second of draft + verify time over the reference's tokens per
  second of forward time; ``policies.md`` section 0 with every term measured). It is the speedup minus the
  loop's overhead, not an upper bound over drafters; ``ceiling`` is the same with every drafted token accepted;
* ``greedy_match``: at temperature 0, the fraction of prompts whose output equals the reference's, so a speedup
  is never reported for different output; ``greedy_diffs`` explains each prompt that differs (the first differing
  token and the target's top-2 margin there, :func:`decodekit.diagnostics.first_divergence`), so a floating-point
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
from dataclasses import dataclass, field

from tqdm.auto import tqdm

import decodekit as dk
from decodekit.bench.distributed import World, current_world, merge, place
from decodekit.bench.greedy_diff import GreedyDiff, greedy_diffs
from decodekit.bench.load import disturbed_warning, least_disturbed
from decodekit.bench.lookup_bound import DEPTHS as LOOKUP_DEPTHS
from decodekit.bench.lookup_bound import lookup_tokens_per_forward
from decodekit.bench.methods import Method, Run, Setting, TransformersBaseline
from decodekit.checks import check_int
from decodekit.errors import ConfigError
from decodekit.models import LanguageModel

WARMUP_TOKENS = 16
WIDE_SPREAD = 0.15  # (max - min) / median of a ratio across passes above which the table warns
SLOW_REFERENCE = 1.10  # transformers' generate this much faster than decodekit's autoregressive loop: warn


@dataclass(frozen=True)
class Call:
    """One timed call: ``method`` on batch ``batch`` of ``setting`` at ``batch_size``, in pass ``pass_index``,
    ``order``-th of the methods run on that batch."""

    setting: str
    batch_size: int
    method: str
    pass_index: int
    batch: int
    order: int
    rows: int
    tokens: int
    wall_s: float
    prefill_s: float
    rank: int = 0  # the process that ran it (several with accelerate launch, docs/distributed.md)
    others_cpu: float | None = None  # other processes' share of our CPUs meanwhile (decodekit.bench.load)
    attempts: int = 1  # 1 + the re-runs a disturbed call took


@dataclass
class Result:
    """Aggregated measurements of one method at one (setting, batch size): times, tokens and stats of the median
    pass (by speedup), the speedup's median and min-max over passes, and every pass's decode time."""

    method: str
    setting: str
    batch_size: int
    prompts: int
    tokens: int
    wall_s: float
    prefill_s: float
    sequences: list[list[int]] = field(repr=False)
    stats: dk.SpecStats | None = field(default=None, repr=False)
    speedup: float | None = None
    e2e_speedup: float | None = None
    greedy_match: float | None = None
    zero_overhead: float | None = None
    ceiling: float | None = None
    oracle: float | None = None
    greedy_diffs: list[GreedyDiff] = field(default_factory=list, repr=False)
    speedup_range: tuple[float, float] | None = None
    pass_decode_s: list[float] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    calls: list[Call] = field(default_factory=list, repr=False)
    lookup_bound: dict[int, float] | None = None  # greedy: {draft depth: tokens a forward} (bench.lookup_bound)
    tokens_per_forward: float | None = None  # per row, after prefill: stats' tokens_per_step, or a baseline's count

    @property
    def decode_s(self) -> float:
        return self.wall_s - self.prefill_s

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.wall_s

    @property
    def decode_tokens_per_s(self) -> float:
        return (self.tokens - self.prompts) / self.decode_s  # the first token of each row comes from prefill


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
) -> list[Result]:
    """Measure every method on ``prompts`` for every setting and batch size, interleaved over ``passes`` passes
    (see the module docstring); the first method is the reference.

    Methods that cannot run a batch size (transformers' assisted generation above 1) are skipped there.
    ``prompt_ids`` (e.g. a task's ``id`` column) name the prompts in ``greedy_diffs``; default: their indices.
    Launched as several processes (``accelerate launch``), each runs its share of the batches on its own device
    and every process returns the merged results (:mod:`decodekit.bench.distributed`).
    """
    passes = check_int("passes", passes, low=1)
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
            measured = _measure(model, prompts, fitting, setting, batch_size, max_new_tokens, seed, passes, bar, world)
            group = _results(fitting, *merge(world, *measured), setting, batch_size, len(prompts))
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
                run, others, attempts = least_disturbed(call) if world.size == 1 else (call(), None, 1)
                runs[m][p].append(run)
                tokens = sum(len(s) for s in run.sequences)
                where = (setting.name, batch_size, method.name, p, i, order)
                calls[m].append(
                    Call(*where, len(batch), tokens, run.wall_s, run.prefill_s, world.rank, others, attempts)
                )
                bar.update()
    return runs, calls


def _merged(runs: list[Run]) -> dk.SpecStats | None:
    stats = None
    for run in runs:
        if run.stats is not None:
            stats = run.stats if stats is None else stats.merge(run.stats)
    return stats


def _median_index(values: list[float]) -> int:
    """Index of the (lower) median of ``values``."""
    return sorted(range(len(values)), key=values.__getitem__)[(len(values) - 1) // 2]


def _results(
    methods: list[Method | TransformersBaseline],
    runs: list[list[list[Run]]],
    calls: list[list[Call]],
    setting: Setting,
    batch_size: int,
    prompts: int,
) -> list[Result]:
    """One :class:`Result` per method, measured against the reference (the first method) pass by pass: the
    speedup's median pass gives the reported times and stats, all passes the spread; plus the warnings."""
    ref_passes = runs[0]
    results: list[Result] = []
    for method, passes, method_calls in zip(methods, runs, calls):
        speedups, e2e, zero, ceiling = [], [], [], []
        for mine, ref in zip(passes, ref_passes):
            rate, ref_rate = _rates(mine, prompts), _rates(ref, prompts)
            speedups.append(rate[0] / ref_rate[0])
            e2e.append(rate[1] / ref_rate[1])
            z, c = _zero_overhead(mine, ref, prompts)
            zero.append(z)
            ceiling.append(c)
        decode_s = [sum(r.wall_s - r.prefill_s for r in runs_) for runs_ in passes]
        m = _median_index(speedups if results else decode_s)  # the reference's ratios are all 1: its median time
        sequences = [s for run in passes[0] for s in run.sequences]  # the same in every pass (same seeds)
        stats = _merged(passes[m])
        result = Result(
            method=method.name,
            setting=setting.name,
            batch_size=batch_size,
            prompts=prompts,
            tokens=sum(len(s) for s in sequences),
            wall_s=sum(r.wall_s for r in passes[m]),
            prefill_s=sum(r.prefill_s for r in passes[m]),
            sequences=sequences,
            stats=stats,
            speedup=speedups[m],
            e2e_speedup=e2e[m],
            zero_overhead=zero[m],
            ceiling=ceiling[m],
            oracle=_oracle(method, passes[m], batch_size),
            speedup_range=(min(speedups), max(speedups)),
            pass_decode_s=decode_s,
            calls=method_calls,
            tokens_per_forward=_tokens_per_forward(passes[m], stats),
        )
        if setting.greedy:
            reference = results[0].sequences if results else sequences
            result.greedy_match = sum(a == b for a, b in zip(sequences, reference)) / len(reference)
        low, high = result.speedup_range
        if len(speedups) > 1 and (high - low) / result.speedup > WIDE_SPREAD:
            result.warnings.append(
                f"speedup varies {low:.2f}x-{high:.2f}x across passes: the machine was busy; rerun or raise passes"
            )
        result.warnings += disturbed_warning([c.others_cpu for c in method_calls])
        if isinstance(method, TransformersBaseline) and method.kind == "greedy" and result.speedup > SLOW_REFERENCE:
            warning = (
                f"transformers' generate is {result.speedup:.2f}x decodekit's autoregressive loop here: a slow "
                "reference inflates every speedup in this table"
            )
            result.warnings.append(warning)
            results[0].warnings.append(warning)
        results.append(result)
    return results


def _tokens_per_forward(runs: list[Run], stats: dk.SpecStats | None) -> float | None:
    """Tokens committed per row per target forward after prefill over a pass: decodekit's ``tokens_per_step``
    (``stats``, the pass's merged counters), or from a transformers baseline's counted forwards (batch 1); None where
    not counted."""
    if stats is not None:
        return stats.tokens_per_step
    if not runs or any(r.forwards is None for r in runs):
        return None
    forwards = sum(r.forwards or 0 for r in runs)
    return sum(len(s) - 1 for r in runs for s in r.sequences) / forwards if forwards else None


def _rates(runs: list[Run], prompts: int) -> tuple[float, float]:
    """(decode tokens/s, end-to-end tokens/s) of one pass; the first token of each row comes from prefill."""
    tokens = sum(len(s) for run in runs for s in run.sequences)
    wall = sum(r.wall_s for r in runs)
    return (tokens - prompts) / (wall - sum(r.prefill_s for r in runs)), tokens / wall


def _oracle(method: Method | TransformersBaseline, runs: list[Run], batch_size: int) -> float | None:
    """The oracle-length bound of the pass (``policies.analytic.oracle_speedup``) with the method's measured
    costs, when it has them (``Method.costs``)."""
    stats, costs = _merged(runs), getattr(method, "costs", None)
    if stats is None or not costs or not stats.rounds:
        return None
    from decodekit.policies.analytic import cost_at, oracle_speedup

    rounds = [k for k, n in enumerate(stats.round_max_accepted) for _ in range(n)]
    steps = sum(max(len(s) for s in run.sequences) - 1 for run in runs)
    return oracle_speedup(rounds, stats.rounds - len(rounds), steps, cost_at(costs, batch_size))


def _zero_overhead(runs: list[Run], ref_runs: list[Run], prompts: int) -> tuple[float | None, float | None]:
    """The pass's speedup with zero loop overhead, and with every drafted token accepted (see the module doc)."""
    s, ref = _merged(runs), _merged(ref_runs)
    if s is None or ref is None or not s.rounds or not ref.verify_time_s:
        return None, None
    ref_tokens = sum(len(x) for run in ref_runs for x in run.sequences)
    forward_rate = (ref_tokens - prompts) / ref.verify_time_s  # plain decoding, no loop overhead
    work = s.draft_time_s + s.verify_time_s
    tokens = sum(len(x) for run in runs for x in run.sequences)
    return (tokens - prompts) / work / forward_rate, (s.row_steps + s.drafted) / work / forward_rate
