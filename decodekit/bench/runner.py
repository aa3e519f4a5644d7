"""Run methods over a prompt set and collect comparable measurements.

Protocol, for every (sampling setting, batch size): the first method is the reference (autoregressive decoding);
every method gets one untimed warm-up call (first batch, 16 new tokens), then one timed call per batch of
prompts, all on the same prompts with the same seeds. Reported per method:

* tokens/s end to end and for decoding alone (prefill, i.e. time to the first token, reported separately);
* ``speedup``: decode tokens/s over the reference's, measured in the same run;
* mean acceptance length, per-position acceptance rate, draft / verify / other time;
* ``bound``: the speedup the measured acceptance and measured draft + verify costs would give with zero loop
  overhead: tokens committed per second of draft + verify time over the reference's tokens per second of forward
  time (the analytical model of ``policies.md`` section 0, ``E[committed] / (k c + v(k))`` per round, with every
  term measured; summing over the run keeps it exact when rows of a batch finish in different rounds); the
  ``ceiling`` if every drafted token were accepted; ``speedup / bound`` is how much of it the loop realises;
* ``greedy_match``: at temperature 0, the fraction of prompts whose output equals the reference's, so a speedup
  is never reported for different output; ``greedy_diffs`` explains each prompt that differs (the first differing
  token and the target's top-2 margin there, :func:`decodekit.diagnostics.first_divergence`), so a floating-point
  near-tie is told apart from a bug. The diagnostics run after every timed call, outside the timed regions.
"""

from __future__ import annotations

import platform
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from tqdm.auto import tqdm

import decodekit as dk
from decodekit.bench.methods import Method, Run, Setting, TransformersBaseline
from decodekit.diagnostics import Divergence, first_divergences
from decodekit.errors import ConfigError
from decodekit.models import LanguageModel

WARMUP_TOKENS = 16


@dataclass(frozen=True)
class GreedyDiff:
    """A prompt whose greedy output differs from the reference's.

    Attributes:
        prompt: the prompt's id (its task id when the runner was given ``prompt_ids``, else its index).
        divergence: the first differing token and the target's ranking there; None when one output is a strict
            prefix of the other (a stopping difference: EOS or length, verdict ``"length"``).
        reference_length: generated tokens of the reference's output.
        candidate_length: generated tokens of this method's output.
    """

    prompt: int | str
    divergence: Divergence | None
    reference_length: int
    candidate_length: int

    @property
    def verdict(self) -> str:
        """``"near_tie"`` (float rounding), ``"mismatch"`` (a bug) or ``"length"`` (stopped at a different point)."""
        return self.divergence.verdict if self.divergence else "length"

    @property
    def position(self) -> int:
        """The first generated position where the outputs differ (for ``length``: where the shorter one ends)."""
        return self.divergence.position if self.divergence else min(self.reference_length, self.candidate_length)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = dict(prompt=self.prompt, position=self.position, verdict=self.verdict)
        out.update(margin=self.divergence.margin if self.divergence else None)
        out.update(reference_length=self.reference_length, candidate_length=self.candidate_length)
        if self.divergence:
            out.update({k: v for k, v in self.divergence.to_dict().items() if k not in out})
        return out

    def __str__(self) -> str:
        if self.divergence:
            return f"prompt {self.prompt}, {self.divergence}"
        return (
            f"prompt {self.prompt}: same tokens, different length (reference {self.reference_length}, "
            f"candidate {self.candidate_length}): LENGTH"
        )


@dataclass
class Result:
    """Aggregated measurements of one method at one (setting, batch size)."""

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
    bound: float | None = None
    ceiling: float | None = None
    greedy_diffs: list[GreedyDiff] = field(default_factory=list, repr=False)

    @property
    def decode_s(self) -> float:
        return self.wall_s - self.prefill_s

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.wall_s

    @property
    def decode_tokens_per_s(self) -> float:
        return (self.tokens - self.prompts) / self.decode_s  # the first token of each row comes from prefill

    def to_dict(self) -> dict[str, Any]:
        out = {k: v for k, v in asdict(self).items() if k not in ("sequences", "stats", "greedy_diffs")}
        out.update(greedy_diffs=[d.to_dict() for d in self.greedy_diffs])
        out.update(decode_s=self.decode_s, tokens_per_s=self.tokens_per_s, decode_tokens_per_s=self.decode_tokens_per_s)
        if self.stats is not None:
            s = self.stats
            out.update(
                mean_acceptance_length=s.mean_acceptance_length,
                tokens_per_step=s.tokens_per_step,
                acceptance_rate_per_pos=s.acceptance_rate_per_pos,
                draft_s=s.draft_time_s,
                verify_s=s.verify_time_s,
                other_s=s.other_time_s,
                rounds=s.rounds,
            )
        return out


def run_benchmark(
    model: LanguageModel,
    prompts: Sequence[list[int]],
    methods: Sequence[Method | TransformersBaseline],
    *,
    settings: Sequence[Setting] = (Setting(name="greedy"),),
    batch_sizes: Sequence[int] = (1,),
    max_new_tokens: int = 128,
    seed: int = 0,
    progress: bool = True,
    prompt_ids: Sequence[int | str] | None = None,
) -> list[Result]:
    """Measure every method on ``prompts`` for every setting and batch size; the first method is the reference.

    Methods that cannot run a batch size (transformers' assisted generation above 1) are skipped there.
    ``prompt_ids`` (e.g. a task's ``id`` column) name the prompts in ``greedy_diffs``; default: their indices.
    """
    prompts = [list(p) for p in prompts]
    ids = list(prompt_ids) if prompt_ids is not None else list(range(len(prompts)))
    if len(ids) != len(prompts):
        raise ConfigError(f"got {len(ids)} prompt ids for {len(prompts)} prompts")
    units = sum(len(_batches(prompts, b)) + 1 for _ in settings for b in batch_sizes for m in methods if _fits(m, b))
    bar = tqdm(total=units, desc="benchmark", disable=not progress, unit="call")
    results = []
    differing: list[tuple[Result, Result]] = []  # (result, its reference), diagnosed after all timing
    for setting in settings:
        for batch_size in batch_sizes:
            reference: Result | None = None
            for method in methods:
                if not _fits(method, batch_size):
                    continue
                bar.set_postfix_str(f"{setting.name} b={batch_size} {method.name}")
                result = _measure(model, prompts, method, setting, batch_size, max_new_tokens, seed, bar)
                reference = reference or result
                _compare(result, reference, setting)
                results.append(result)
                if result.greedy_match is not None and result.greedy_match < 1:
                    differing.append((result, reference))
    bar.close()
    for result, reference in differing:
        result.greedy_diffs = _greedy_diffs(model, prompts, ids, reference.sequences, result.sequences)
    return results


def _fits(method: Method | TransformersBaseline, batch_size: int) -> bool:
    return method.max_batch is None or batch_size <= method.max_batch


def _batches(prompts: list[list[int]], batch_size: int) -> list[list[list[int]]]:
    return [prompts[i : i + batch_size] for i in range(0, len(prompts), batch_size)]


def _measure(
    model: LanguageModel,
    prompts: list[list[int]],
    method: Method | TransformersBaseline,
    setting: Setting,
    batch_size: int,
    max_new_tokens: int,
    seed: int,
    bar: tqdm,
) -> Result:
    batches = _batches(prompts, batch_size)
    method.generate(model, batches[0], setting, min(max_new_tokens, WARMUP_TOKENS), seed)  # warm-up (lazy init)
    bar.update()
    runs: list[Run] = []
    for i, batch in enumerate(batches):
        runs.append(method.generate(model, batch, setting, max_new_tokens, seed + i))
        bar.update()
    stats = None
    if runs[0].stats is not None:
        stats = runs[0].stats
        for run in runs[1:]:
            stats = stats.merge(run.stats)
    sequences = [s for run in runs for s in run.sequences]
    return Result(
        method=method.name,
        setting=setting.name,
        batch_size=batch_size,
        prompts=len(prompts),
        tokens=sum(len(s) for s in sequences),
        wall_s=sum(r.wall_s for r in runs),
        prefill_s=sum(r.prefill_s for r in runs),
        sequences=sequences,
        stats=stats,
    )


def _compare(result: Result, reference: Result, setting: Setting) -> None:
    """Fill in the fields measured against the reference (autoregressive decoding in the same run)."""
    result.speedup = result.decode_tokens_per_s / reference.decode_tokens_per_s
    result.e2e_speedup = result.tokens_per_s / reference.tokens_per_s
    if setting.greedy:
        same = sum(a == b for a, b in zip(result.sequences, reference.sequences))
        result.greedy_match = same / len(reference.sequences)
    s, ref = result.stats, reference.stats
    if s is None or ref is None or not s.rounds or not ref.verify_time_s:
        return
    forward_rate = (reference.tokens - reference.prompts) / ref.verify_time_s  # plain decoding, no loop overhead
    work = s.draft_time_s + s.verify_time_s
    result.bound = (result.tokens - result.prompts) / work / forward_rate
    result.ceiling = (s.row_steps + s.drafted) / work / forward_rate  # every drafted token accepted


def _greedy_diffs(
    model: LanguageModel,
    prompts: list[list[int]],
    ids: list[int | str],
    references: list[list[int]],
    candidates: list[list[int]],
) -> list[GreedyDiff]:
    """Explain every prompt whose output differs from the reference's (untimed: target forwards)."""
    rows = [i for i, (r, c) in enumerate(zip(references, candidates)) if r != c]
    pick = [[seqs[i] for i in rows] for seqs in (prompts, references, candidates)]
    divergences = first_divergences(model, *pick)
    return [GreedyDiff(ids[i], d, len(references[i]), len(candidates[i])) for i, d in zip(rows, divergences)]


def machine_info(model: LanguageModel) -> dict[str, Any]:
    """Where a benchmark ran: CPU/GPU, threads, library versions."""
    import transformers

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    info = {
        "device": str(model.device),
        "cpu": cpu,
        "torch_threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "decodekit": dk.__version__,
    }
    if model.device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(model.device)
    return info
