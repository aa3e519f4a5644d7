"""A diffusion-LM benchmark method's spec (:func:`decodekit.bench.dlm.run`'s ``methods`` and ``base``) and its step
budgets, checked before any model loads."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from decodekit.checks import check_choice, check_instance, check_int, describe, is_int
from decodekit.errors import ConfigError, ConfigTypeError
from decodekit.models.compile_switch import CHOICES as COMPILE_CHOICES

METHOD_KEYS = ("rule", "cache", "schedule", "draft", "tokens_per_step", "uncached", "compile")
"""What a method's spec may hold (:func:`~decodekit.bench.dlm.run`'s ``methods``)."""


def check_gen_lengths(gen_lengths: Any, block_length: int) -> list[int]:
    """``gen_lengths`` (an integer or a list of them, each >= 1) as a list; each must hold whole blocks."""
    values = [gen_lengths] if is_int(gen_lengths) else gen_lengths
    if isinstance(values, (str, bytes, Mapping)) or not isinstance(values, Sequence):
        raise ConfigTypeError(f"gen_lengths must be a list of integers >= 1 (e.g. [128, 256]), got {describe(values)}")
    lengths = [check_int("gen_lengths", g, low=1, hint=" (each entry)") for g in values]
    for g in lengths:
        if g % min(block_length, g):
            raise ConfigError(
                f"gen_lengths holds {g}, which is not a whole number of blocks of block_length={block_length}; use "
                "multiples of block_length"
            )
    return lengths  # type: ignore[return-value]


def method_spec(name: str, spec: Any) -> dict[str, Any]:
    """A method's spec, checked: a mapping of :data:`METHOD_KEYS`, each part an instance of its protocol (None = the
    default), ``tokens_per_step`` an integer >= 1, ``uncached`` a method's name."""
    from decodekit.dlm.interfaces import DLMCache, DLMDraft, RegionSchedule, UnmaskRule

    if not isinstance(spec, Mapping):
        raise ConfigTypeError(
            f"{name} must be a mapping with keys among {', '.join(METHOD_KEYS)} (or null: off), got {describe(spec)}"
        )
    if unknown := sorted(str(k) for k in spec if k not in METHOD_KEYS):
        raise ConfigError(f"{name} has unknown key(s) {unknown}; a method's keys: {', '.join(METHOD_KEYS)}")
    parts = {
        "rule": (UnmaskRule, "select(state, proposal, eligible)"),
        "cache": (DLMCache, "logits(dlm, state)"),
        "schedule": (RegionSchedule, "rounds() and region()"),
        "draft": (DLMDraft, "variants(state, proposal, committed, left)"),
    }
    for key, (protocol, what) in parts.items():
        check_instance(f"{name}.{key}", spec.get(key), protocol, what=what)
    check_int(f"{name}.tokens_per_step", spec.get("tokens_per_step"), low=1, optional=True)
    if spec.get("compile") is not None:
        check_choice(f"{name}.compile", spec["compile"], COMPILE_CHOICES)
    uncached = spec.get("uncached")
    if uncached is not None and not isinstance(uncached, str):
        raise ConfigTypeError(f"{name}.uncached must be None or a method's name, got {describe(uncached)}")
    return dict(spec)


def check_steps(name: str, spec: dict[str, Any], lengths: list[tuple[str, int, int]]) -> None:
    """Refuse a ``tokens_per_step`` that gives a generation length a step budget :func:`decodekit.dlm.generate`
    refuses (fewer steps than blocks, or not a multiple of them), before any model loads. ``lengths``: ``(key,
    generation length, block length)`` of each run."""
    tokens = int(spec.get("tokens_per_step") or 1)
    for key, gen, block in lengths:
        blocks, steps = gen // block, gen // tokens
        if steps < blocks or steps % blocks:
            raise ConfigError(
                f"{name}.tokens_per_step={tokens} gives {key} {gen} a budget of {steps} steps for its {blocks} "
                f"block(s) of {block}: the steps must be a positive multiple of the blocks; use a tokens_per_step "
                f"that divides {block} (a block's length)"
            )


def steps_of(spec: dict[str, Any], gen: int) -> int:
    """A method's step budget at generation length ``gen``: ``gen / tokens_per_step`` (default 1)."""
    return gen // int(spec.get("tokens_per_step") or 1)


__all__ = ["METHOD_KEYS", "check_gen_lengths", "check_steps", "method_spec", "steps_of"]
