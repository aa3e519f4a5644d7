"""The Protocols a diffusion sampler's parts implement (:func:`decodekit.dlm.generate`), and every optional hook and
flag they may declare. A notebook class satisfies them without inheriting anything.

Required, one per role: :class:`UnmaskRule` (``select``), :class:`DLMCache` (``logits``), :class:`RegionSchedule`
(``rounds``, ``region``) and :class:`DLMDraft` (``variants``). Optional, each checked once when a call resolves its
parts (:func:`declared`; nothing is looked up on a part while the loop runs):

=======================  ==================  ===============================================================
hook / flag              role                what it does
=======================  ==================  ===============================================================
:class:`BeginsBlock`     rule                ``begin_block(state)``: a block starts
:class:`BeginsCall`      cache               ``begin(state)``: a call starts (drop an earlier call's K/V)
:class:`RunsMany`        cache               ``logits_many(dlm, state, canvases)``: several canvases, one forward
:class:`CountsForwards`  cache               ``forwards``: forwards it ran besides the steps' own
:class:`NamesNextBlock`  schedule            ``next_block(state)``: the block after ``state.block`` (lookahead)
:class:`Finishes`        draft               ``finishes(left)``: may the drafts finish a row's block
:class:`ChecksDLM`       any                 ``check_model(dlm)``: refuse a model it cannot run with
``per_row_steps``        rule                a row's commits depend on that row only: rows may step apart
``plans``                rule                publishes ``state.planned``, the slots it commits next
``fixed_blocks``         any                 needs (schedule: gives) the same block in every row
``block_causal``         cache               attends block-causally
``lookahead``            cache               ``logits_many`` also computes ``state.lookahead``'s block
``needs_plan``           cache               feeds only ``state.planned`` (needs a rule that ``plans``)
``slides``               schedule            the window moves after each commit: ``region`` is called again
=======================  ==================  ===============================================================

A part that defines a name one edit off a hook (``begin_blok``) gets a warning when the call starts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple, Protocol, runtime_checkable

import torch

if TYPE_CHECKING:
    from collections.abc import Iterator

    from decodekit.dlm.model import DLMModel
    from decodekit.dlm.state import DLMState, Proposal, SlotLogits


@runtime_checkable
class UnmaskRule(Protocol):
    """Decides which slots of a diffusion LM's canvas to commit this step (:func:`decodekit.dlm.generate`).
    Optional: :class:`BeginsBlock`, :class:`ChecksDLM`; flags ``per_row_steps`` (a promise that a row's commits depend
    only on that row, its step in the block read from ``state.steps_in_block()``, never ``state.step`` or
    ``state.progress``, and that a row with no eligible slot gets none, so that with drafts each row may take its own
    number of steps a forward), ``plans``, ``fixed_blocks``. What the parts return is checked
    (:mod:`decodekit.dlm.components`)."""

    def select(self, state: DLMState, proposal: Proposal, eligible: torch.Tensor) -> torch.Tensor:
        """``[B, G]`` bool: the slots to commit with ``proposal.tokens``. ``eligible [B, G]``: the masked slots of
        the current block; a rule may commit other masked slots too (Prophet fills them all; EoTStop fills the tail
        after an end-of-text token, replacing those slots' ``proposal.tokens``), and must commit at least one slot of
        every row that has an eligible one (the loop checks)."""
        ...


@runtime_checkable
class DLMCache(Protocol):
    """How a diffusion sampler's step gets its logits: recompute, or reuse K/V kept from an earlier forward.
    Optional: :class:`BeginsCall`, :class:`RunsMany` (what drafts need), :class:`CountsForwards`,
    :class:`ChecksDLM`; flags ``lookahead`` (a promise that ``logits_many`` also computes the block
    ``state.lookahead`` names when it is set: :mod:`decodekit.dlm.lookahead`), ``block_causal``, ``fixed_blocks``,
    ``needs_plan``."""

    def logits(self, dlm: DLMModel, state: DLMState) -> torch.Tensor | SlotLogits:
        """``[B, G, V]`` float32 logits of the generation region for this step (``state.step == 0``: a block's
        first step), zeros for slots it did not predict; or a :class:`~decodekit.dlm.state.SlotLogits` window
        ``[B, W, V]`` from slot ``lo`` when it predicts one span (the current block), which saves the step the
        other ``G - W`` slots' softmax. Rules commit only slots of the window (and ``eligible`` lies in it)."""
        ...


@runtime_checkable
class DLMDraft(Protocol):
    """Self-speculation for a diffusion sampler: guesses of the canvases the next steps will reach, which
    :func:`decodekit.dlm.generate` verifies in the next forward (the cache's ``logits_many``) so that one forward
    takes several of the sampler's own steps; the output does not change. Optional: :class:`Finishes` (when it says
    so for some row, the loop looks ahead: ``state.lookahead``, :mod:`decodekit.dlm.lookahead`),
    :class:`ChecksDLM`; flag ``fixed_blocks``."""

    def variants(self, state: DLMState, proposal: Proposal, committed: torch.Tensor, left: int) -> torch.Tensor | None:
        """``[1 + D, B, T]``: ``state.canvas`` first, then the canvases drafted for the next ``D`` steps (each
        ``state.canvas`` with more slots of the current block committed); None = no drafts this time. ``proposal``
        and ``committed [B, G]``: the step just taken; ``left``: the most masked slots a row has left in its block.
        A canvas that commits all of a row's is of use only while ``state.lookahead`` is set."""
        ...


@runtime_checkable
class RegionSchedule(Protocol):
    """Which slots of a diffusion LM's canvas a step may commit, and when a block ends (:func:`decodekit.dlm.generate`).
    Flag ``fixed_blocks``: whether every row is in the same block ``state.block`` (the K/V-keeping caches need it).
    Optional: :class:`NamesNextBlock` (drafts may then look ahead into it: :mod:`decodekit.dlm.lookahead`),
    :class:`ChecksDLM`; flag ``slides``."""

    def rounds(self, dlm: DLMModel, state: DLMState) -> Iterator[None]:
        """Prepare each block (``state.block`` or ``state.region``, ``block_steps``, ``step = 0``) and yield; the
        loop then steps until no slot of ``state.in_block`` is masked."""
        ...

    def region(self, state: DLMState, proposal: Proposal) -> torch.Tensor:
        """``[G]`` or ``[B, G]`` bool, called every step after the proposals: the slots this step may commit (the
        masked ones among them are the rule's ``eligible``)."""
        ...


# ------------------------------------------------------------------------------------------ optional hooks
@runtime_checkable
class BeginsBlock(Protocol):
    def begin_block(self, state: DLMState) -> None:
        """A rule's hook: a block starts (``state.step == 0``), before its first ``select``."""
        ...


@runtime_checkable
class BeginsCall(Protocol):
    def begin(self, state: DLMState) -> None:
        """A cache's hook: a :func:`~decodekit.dlm.generate` call starts (drop what an earlier call kept)."""
        ...


@runtime_checkable
class RunsMany(Protocol):
    def logits_many(self, dlm: DLMModel, state: DLMState, canvases: torch.Tensor) -> torch.Tensor | SlotLogits:
        """``[C, B, G, V]`` (or a ``[C, B, W, V]`` window): the logits of each of ``canvases [C, B, T]`` in one
        forward (``canvases[0]`` is ``state.canvas``)."""
        ...


@runtime_checkable
class CountsForwards(Protocol):
    """A cache that runs forwards of its own besides the steps' (reported as ``DLMStats.cache_forwards``)."""

    forwards: int


@runtime_checkable
class NamesNextBlock(Protocol):
    def next_block(self, state: DLMState) -> tuple[int, int] | None:
        """The block after ``state.block`` as ``(start, end)`` slots, or None after the last."""
        ...


@runtime_checkable
class Finishes(Protocol):
    def finishes(self, left: int) -> bool:
        """Whether the drafts may finish the block of a row with ``left`` masked slots in it."""
        ...


@runtime_checkable
class ChecksDLM(Protocol):
    def check_model(self, dlm: DLMModel) -> None:
        """Raise :class:`~decodekit.errors.ConfigError` for a setting ``dlm`` cannot take (token ids outside its
        vocabulary), when a call starts, before any forward."""
        ...


FLAGS = ("per_row_steps", "fixed_blocks", "block_causal", "lookahead", "slides", "plans", "needs_plan")
"""What a part may declare about itself, each True or False (``"false"`` would read as True)."""

HOOKS = {
    "rule": ("select", "begin_block", "check_model", "per_row_steps", "plans", "fixed_blocks"),
    "cache": (
        "logits",
        "begin",
        "logits_many",
        "forwards",
        "check_model",
        "fixed_blocks",
        "block_causal",
        "lookahead",
        "needs_plan",
    ),
    "schedule": ("rounds", "region", "next_block", "check_model", "fixed_blocks", "slides"),
    "draft": ("variants", "finishes", "check_model", "fixed_blocks"),
}
"""Every method or attribute name the sampler looks for, per role (typo warnings compare against these)."""


def flag(part: object, name: str) -> bool:
    """A part's declared flag ``name`` (:data:`FLAGS`; False when it declares none)."""
    return bool(getattr(part, name, False))


class Declared(NamedTuple):
    """What a call's parts declared, read once when the call resolves them (:func:`declared`)."""

    per_row_steps: bool  # the rule's: rows may take their own number of steps a forward
    begins_block: bool  # the rule has begin_block
    cache_begins: bool  # the cache has begin
    counts_forwards: bool  # the cache counts its forwards
    slides: bool  # the schedule's window moves after each commit
    lookahead: bool  # drafts may look into the next block: schedule.next_block, draft.finishes, cache.lookahead


def declared(rule: object, cache: object, schedule: object, draft: object) -> Declared:
    """The hooks and flags of a call's parts (:class:`Declared`)."""
    look = isinstance(schedule, NamesNextBlock) and isinstance(draft, Finishes) and flag(cache, "lookahead")
    return Declared(
        per_row_steps=flag(rule, "per_row_steps"),
        begins_block=isinstance(rule, BeginsBlock),
        cache_begins=isinstance(cache, BeginsCall),
        counts_forwards=isinstance(cache, CountsForwards),
        slides=flag(schedule, "slides"),
        lookahead=look,
    )


__all__ = [
    "FLAGS",
    "HOOKS",
    "BeginsBlock",
    "BeginsCall",
    "ChecksDLM",
    "CountsForwards",
    "DLMCache",
    "DLMDraft",
    "Declared",
    "Finishes",
    "NamesNextBlock",
    "RegionSchedule",
    "RunsMany",
    "UnmaskRule",
    "declared",
    "flag",
]
