"""The parts of a diffusion sampler's call (rule, cache strategy, region schedule, draft strategy): defaults filled
in, then checked alone and together before any forward, so that a combination that cannot work fails with a
message saying what to use instead."""

from __future__ import annotations

from typing import Any, NamedTuple

from decodekit.checks import check_bool, check_instance
from decodekit.dlm.caches import Recompute
from decodekit.dlm.interfaces import (
    FLAGS,
    HOOKS,
    ChecksDLM,
    Declared,
    DLMCache,
    DLMDraft,
    RegionSchedule,
    RunsMany,
    UnmaskRule,
    declared,
    flag,
)
from decodekit.dlm.model import DLMModel
from decodekit.dlm.rules import LLaDARule
from decodekit.dlm.schedules import FixedBlocks
from decodekit.errors import ConfigError
from decodekit.interfaces import warn_near_hooks


class Parts(NamedTuple):
    """What one :func:`~decodekit.dlm.generate` call runs, checked together, and what the parts declared (their
    optional hooks and flags, read once: :func:`~decodekit.dlm.interfaces.declared`)."""

    rule: Any
    cache: Any
    schedule: Any
    draft: Any
    declared: Declared


def resolve_parts(
    dlm: DLMModel, rule: Any, cache: Any, schedule: Any, remasking: str, block_length: int, draft: Any = None
) -> Parts:
    """The rule, cache, schedule and draft strategy a call runs (None = the defaults: LLaDA's rule, recompute, fixed
    blocks, no drafts), checked alone, against the model (each part's optional ``check_model(dlm)``: token ids
    outside its vocabulary, ...) and together before any forward."""
    rule = LLaDARule(remasking) if rule is None else rule
    check_instance("rule", rule, UnmaskRule, what="an unmasking rule with select(state, proposal, eligible)")
    cache = Recompute(block_causal=dlm.block_length is not None) if cache is None else cache
    check_instance("cache", cache, DLMCache, what="a cache strategy with logits(dlm, state)")
    schedule = FixedBlocks() if schedule is None else schedule
    check_instance("schedule", schedule, RegionSchedule, what="a region schedule with rounds() and region()")
    if draft is not None:
        check_instance(
            "draft", draft, DLMDraft, what="a draft strategy with variants(state, proposal, committed, left)"
        )
    for role, part in (("rule", rule), ("cache", cache), ("schedule", schedule), ("draft", draft)):
        if part is not None:
            warn_near_hooks(part, HOOKS[role])
            _check_flags(part)
    _check_parts(rule, cache, schedule, draft)
    _check_block_causal(dlm, cache, schedule, block_length)
    for part in (rule, cache, schedule, draft):
        if isinstance(part, ChecksDLM):
            part.check_model(dlm)  # settings the model cannot take, before any forward
    return Parts(rule, cache, schedule, draft, declared(rule, cache, schedule, draft))


def _check_flags(part: Any) -> None:
    """Refuse a declared flag (:data:`FLAGS`) that is not a bool."""
    for name in FLAGS:
        value = getattr(part, name, False)
        if not isinstance(value, bool):
            check_bool(f"{type(part).__name__}.{name}", value)


def _check_parts(rule: Any, cache: Any, schedule: Any, draft: Any = None) -> None:
    """Refuse a rule, cache, schedule and draft strategy that cannot work together, before any forward."""
    if draft is not None and not isinstance(cache, RunsMany):
        raise ConfigError(
            f"{type(draft).__name__} needs a cache that runs several canvases in one forward (logits_many); "
            f"{type(cache).__name__} keeps one canvas's K/V: use cache=None (recompute) or "
            "cache=dk.dlm.BlockCausalCache(), or draft=None"
        )
    if not flag(schedule, "fixed_blocks"):
        parts = (
            (cache, "keeps K/V per block"),
            (rule, "commits by a plan made per block, itself or the rule it wraps"),
            (draft, "drafts per block"),
        )
        for part, why in parts:
            if flag(part, "fixed_blocks"):
                raise ConfigError(
                    f"{type(part).__name__} {why}, which needs the same blocks in every row; "
                    f"{type(schedule).__name__} gives rows their own: use schedule=None (fixed blocks)"
                    + (" or cache=None, DKVCache(), PrefixCache() or DualCache()" if part is cache else "")
                    + (" or draft=None" if part is draft else "")
                )
    if flag(cache, "needs_plan") and not flag(rule, "plans"):
        raise ConfigError(
            f"{type(cache).__name__} feeds only the slots the rule will commit next (state.planned), and "
            f"{type(rule).__name__} does not publish them (plans=True): use rule=dk.dlm.RandomOrderRule() itself "
            "(random remasking in an order drawn per block; a wrapper such as EoTStop commits beyond its plan), or "
            "cache=dk.dlm.DKVCache() for confidence-based rules"
        )


def _check_block_causal(dlm: DLMModel, cache: Any, schedule: Any, block_length: int) -> None:
    """A block-causally trained model runs block-causally, on its own block length and fixed blocks."""
    trained = dlm.block_length
    if trained is None:
        return
    if block_length != trained:
        raise ConfigError(
            f"this model was trained block-causally with blocks of {trained}; got block_length={block_length}: pass "
            f"block_length={trained} (a multiple-block gen_length)"
        )
    if not flag(cache, "block_causal"):
        raise ConfigError(
            f"this model was trained block-causally (blocks of {trained}) and {type(cache).__name__} attends "
            "bidirectionally: use cache=None (block-causal recompute) or cache=dk.dlm.BlockCausalCache() (exact); "
            "to run it bidirectionally anyway, wrap it as dk.dlm.load_model(model.lm, mask_token_id=..., "
            "shift_logits=...) without block_length"
        )
    if not flag(schedule, "fixed_blocks"):
        raise ConfigError(
            f"this model was trained block-causally on fixed blocks of {trained}; {type(schedule).__name__} moves the "
            "block ends: use schedule=None"
        )


def refusal(dlm: DLMModel, spec: dict[str, Any], block_length: int) -> str | None:
    """Why :func:`generate` would refuse ``dlm`` with a method ``spec`` (``{rule, cache, schedule, draft}``; None = the
    defaults) before any forward, or None: for a benchmark to list a method the model cannot run instead of
    failing midway."""
    try:
        resolve_parts(
            dlm,
            spec.get("rule"),
            spec.get("cache"),
            spec.get("schedule"),
            "low_confidence",
            block_length,
            spec.get("draft"),
        )
    except ConfigError as error:
        return str(error)
    return None
