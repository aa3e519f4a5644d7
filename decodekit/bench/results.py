"""Timed runs into results: one :class:`Result` per method and (setting, batch size), read against the reference
pass by pass (the protocol and what each field means: :mod:`decodekit.bench.runner`)."""

from __future__ import annotations

from dataclasses import dataclass, field

import decodekit as dk
from decodekit.bench.greedy_diff import GreedyDiff
from decodekit.bench.load import disturbed_warning
from decodekit.bench.methods import Method, Run, Setting, TransformersBaseline

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


def _merged(runs: list[Run]) -> dk.SpecStats | None:
    stats = None
    for run in runs:
        if run.stats is not None:
            stats = run.stats if stats is None else stats.merge(run.stats)
    return stats


def _median_index(values: list[float]) -> int:
    """Index of the (lower) median of ``values``."""
    return sorted(range(len(values)), key=values.__getitem__)[(len(values) - 1) // 2]


def aggregate(
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
        reruns = max((c.attempts for c in method_calls), default=1) - 1
        result.warnings += disturbed_warning([c.others_cpu for c in method_calls], reruns)
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
    deepest = sum(s.drafted_per_pos)  # each drafted row-round's deepest path (a tree accepts one path at most)
    return (tokens - prompts) / work / forward_rate, (s.row_steps + deepest) / work / forward_rate


__all__ = ["Call", "Result", "aggregate"]
