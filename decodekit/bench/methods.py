"""What a benchmark runs: decodekit methods (a drafter, verifier and policy) and transformers baselines.

Both kinds expose ``generate(model, prompts, setting, max_new_tokens, seed) -> Run``, timed with the same
protocol (synchronised ``perf_counter`` around the call; tokenisation happens before, in the task loader).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import torch

import decodekit as dk
from decodekit.models import LanguageModel
from decodekit.timing import timed_call
from decodekit.types import SamplingParams


@dataclass(frozen=True, kw_only=True)
class Setting(SamplingParams):
    """Named sampling parameters, e.g. ``Setting(name="t0.8", temperature=0.8)`` (validated like ``generate()``'s)."""

    name: str


@dataclass
class Run:
    """One timed call on one batch of prompts.

    Attributes:
        sequences: generated tokens per prompt.
        wall_s: wall time of the call.
        prefill_s: time to the first token (prefill); the rest of ``wall_s`` is decoding.
        stats: decodekit's counters (None for transformers baselines).
        forwards: a transformers baseline's target forwards after prefill, at batch 1 (None where not counted).
    """

    sequences: list[list[int]]
    wall_s: float
    prefill_s: float
    stats: dk.SpecStats | None = None
    forwards: int | None = None


@dataclass
class Method:
    """A decodekit configuration: ``drafter=None`` is autoregressive decoding.

    ``fresh``: every component with a ``clear()`` (a suffix cache, Token Recycling's matrix, SWIFT's searched
    set, a policy's carried-over schedule) is cleared before each call, outside the timing. A benchmark repeats its
    prompts (warm-up, passes), so a component that remembers earlier calls would otherwise hold the timed prompt's
    own output from the second pass on.

    ``compile``: ``dk.generate``'s ``compile=`` (True, False, ``"auto"``, ``"max-autotune"``); the benchmark's
    warm-up call compiles, so timed calls see compiled forwards only (the compile time is not in the table)."""

    name: str
    drafter: Any = None
    verifier: Any = None
    policy: Any = None
    max_batch: int | None = None
    costs: Any = None  # {batch size: CostModel} of this drafter (decodekit.policies.profile_costs): oracle column
    fresh: bool = False
    compile: bool | str = False

    def generate(
        self, model: LanguageModel, prompts: list[list[int]], setting: Setting, max_new_tokens: int, seed: int
    ) -> Run:
        if self.fresh:
            for component in (self.drafter, self.verifier, self.policy):
                clear = getattr(component, "clear", None)
                if callable(clear):
                    clear()
        out, wall = timed_call(
            lambda: dk.generate(
                model,
                prompts,
                self.drafter,
                self.verifier,
                self.policy,
                max_new_tokens=max_new_tokens,
                temperature=setting.temperature,
                top_k=setting.top_k,
                top_p=setting.top_p,
                seed=seed,
                compile=self.compile,
            ),
            model.device,
        )
        return Run(out.sequences, wall, out.stats.prefill_time_s, out.stats)


@dataclass
class TransformersBaseline:
    """transformers' own ``generate``: plain, with its static cache and ``torch.compile`` (``static_compiled``:
    ``cache_implementation="static"`` and a ``CompileConfig``, CUDA graphs on CUDA; the anchor for decodekit's
    ``compile=True``), prompt lookup (``prompt_lookup_num_tokens``), assisted generation (``assistant_model``) or its
    early-exit assistant (``assistant_early_exit=exit_layer``: the target's first ``exit_layer`` layers and its head
    draft; no KV reuse). All but the first two are batch-1 only in transformers.

    Rows of a batch are left-padded (as transformers requires); prefill time is measured by a separate
    ``max_new_tokens=1`` call on the same batch.
    """

    name: str
    kind: Literal["greedy", "static_compiled", "prompt_lookup", "assisted", "early_exit"] = "greedy"
    k: int = 4
    assistant: Any = None
    max_ngram: int = 3
    exit_layer: int = 8

    @property
    def max_batch(self) -> int | None:
        return None if self.kind in ("greedy", "static_compiled") else 1

    def generate(
        self, model: LanguageModel, prompts: list[list[int]], setting: Setting, max_new_tokens: int, seed: int
    ) -> Run:
        hf = model.hf
        width = max(len(p) for p in prompts)
        pad = hf.generation_config.pad_token_id
        pad = pad if pad is not None else (model.eos_token_ids[0] if model.eos_token_ids else 0)
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=model.device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=model.device)
        kwargs: dict[str, Any] = dict(attention_mask=mask, pad_token_id=pad, do_sample=not setting.greedy)
        if not setting.greedy:
            kwargs.update(temperature=setting.temperature, top_k=setting.top_k or 0, top_p=setting.top_p or 1.0)
        if self.kind == "prompt_lookup":
            kwargs.update(prompt_lookup_num_tokens=self.k, max_matching_ngram_size=self.max_ngram)
        elif self.kind == "early_exit":  # the target's first exit_layer layers draft (EarlyExitCandidateGenerator)
            kwargs.update(assistant_early_exit=self.exit_layer)
            _constant_draft_length(hf.generation_config, self.k)
        elif self.kind == "static_compiled":  # its static cache and torch.compile: the anchor for compile=True
            from transformers import CompileConfig

            compile_config = CompileConfig(mode="reduce-overhead" if model.device.type == "cuda" else "default")
            compile_config._compile_all_devices = True  # transformers compiles on accelerators only by default
            kwargs.update(cache_implementation="static", compile_config=compile_config)
        elif self.kind == "assisted":
            assistant = self.assistant.hf if isinstance(self.assistant, LanguageModel) else self.assistant
            kwargs.update(assistant_model=assistant)
            _constant_draft_length(assistant.generation_config, self.k)
        torch.manual_seed(seed)
        _, prefill = timed_call(lambda: hf.generate(ids, max_new_tokens=1, **kwargs), model.device)
        torch.manual_seed(seed)
        calls = [0]
        counter = hf.register_forward_pre_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
        try:
            out, wall = timed_call(lambda: hf.generate(ids, max_new_tokens=max_new_tokens, **kwargs), model.device)
        finally:
            counter.remove()
        rows = [_strip(row[width:].tolist(), model.eos_token_ids) for row in out]
        # the early-exit assistant's drafts are forwards of the same module; a batch's forwards serve all its rows
        forwards = calls[0] - 1 if self.kind != "early_exit" and len(prompts) == 1 else None
        # separate calls: a burst in the first may make it look as long as the whole (tiny models, where both are
        # mostly Python overhead); the decode part is then floored at one of the max_new_tokens tokens' share
        return Run(rows, wall, min(prefill, wall * (1 - 1 / max(max_new_tokens, 2))), forwards=forwards)


def _constant_draft_length(config: Any, k: int) -> None:
    """Make transformers' assisted generation draft exactly ``k`` tokens a round (no schedule, no early stop)."""
    config.num_assistant_tokens = k
    config.num_assistant_tokens_schedule = "constant"
    config.assistant_confidence_threshold = 0.0


def _strip(tokens: list[int], eos: tuple[int, ...]) -> list[int]:
    """Cut a transformers row after its first EOS (the rest is padding)."""
    for i, t in enumerate(tokens):
        if t in eos:
            return tokens[: i + 1]
    return tokens
