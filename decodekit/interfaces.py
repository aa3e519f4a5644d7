"""The Protocols a component implements. A notebook class satisfies them without inheriting anything.

Required: :class:`Drafter` (``propose``), :class:`Verifier` (``accepts``, ``lossless``, ``verify``) and
:class:`LengthPolicy` (``plan``). Any of the three may also implement the optional hooks below; the loop checks
each with ``isinstance`` once per call and calls what is there:

=====================  ==========================================================================================
:class:`Begins`        ``begin(state)``: once per call, after prefill (reset per-row state, prefill a draft model)
:class:`SharesTarget`  drafters with ``shares_target = True`` get ``begin(state, target, cache)`` instead: the
                       target adapter and its :class:`~decodekit.cache.KVCache` (self-speculation, feature heads);
                       with ``needs`` "prefill" also ``prefill=`` the prefill's output
:class:`Observes`      ``observe(state, round)``: after every round, once the state holds the new tokens
:class:`SelectsRows`   ``select_rows(rows)``: rows finished; keep only ``rows [B']`` of any per-row state
                       (with ``needs`` "host_rows" also ``host_rows=``, the same rows as Python ints)
:class:`Needs`         ``needs``: what the :class:`~decodekit.spec.round.Round` should carry (see its module)
:class:`DeclaresKind`  ``draft_kind(sampling)`` (drafters): checked against the verifier before anything runs
:class:`HasVocab`      ``vocab_size`` (drafters): checked against the target's
:class:`ChecksSampling` ``check(sampling)`` (verifiers): raise ``ConfigError`` for unsupported settings
:class:`HasDefaultPolicy` ``default_policy()`` (drafters): the length policy a call without one uses (else
                       ``FixedLength(4)``): a lookup drafter that wants long drafts says so here
:class:`ChecksModel`   ``check_model(target)`` (drafters): when the call starts, before any forward: raise
                       ``ConfigError`` for a target it cannot draft for (a head trained for another target)
=====================  ==========================================================================================

A component that defines a method one letter off a hook name (``obsrve``) gets a warning when the call starts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

import torch

from decodekit.draft import Draft, DraftKind
from decodekit.draft.budget import DraftBudget
from decodekit.sampling import Generator
from decodekit.spec.state import DecodeState
from decodekit.types import SamplingParams, Verdict

if TYPE_CHECKING:
    from collections.abc import Iterator

    from decodekit.cache import KVCache
    from decodekit.dlm.model import DLMModel
    from decodekit.dlm.state import DLMState, Proposal, SlotLogits
    from decodekit.models.base import LanguageModel
    from decodekit.spec.round import Round


@runtime_checkable
class Drafter(Protocol):
    """Proposes a token tree (a chain is a tree) continuing each row's pending token."""

    def propose(self, state: DecodeState, budget: DraftBudget) -> Draft:
        """Return a :class:`Draft` within ``budget`` (row ``b``: at most ``nodes[b]`` nodes, depth ``depth[b]``)."""
        ...


@runtime_checkable
class Verifier(Protocol):
    """Decides which path of a draft the target accepts, and the next pending token.

    Attributes:
        accepts: the draft kinds it verifies without bias.
        lossless: whether the output distribution equals the target's (greedy: equals greedy decoding).
    """

    accepts: frozenset[DraftKind]
    lossless: bool

    def verify(
        self,
        draft: Draft,
        logits: torch.Tensor,
        sampling: SamplingParams,
        generator: Generator,
    ) -> Verdict:
        """``logits [B, N + 1, V]``: row 0 follows the pending token, row ``i + 1`` follows draft node ``i``.

        ``generator`` is a ``torch.Generator``, None (torch's global one) or per-row generators (``seed`` given one
        int per row): draw through :func:`decodekit.sampling.sample` / :func:`~decodekit.sampling.uniform` with a
        ``key`` so each row's draws stay its own."""
        ...


@runtime_checkable
class LengthPolicy(Protocol):
    """Decides how much each row drafts this round."""

    def plan(self, state: DecodeState) -> DraftBudget:
        """Return the per-row budget (the loop caps its depth by what each row may still generate)."""
        ...


@runtime_checkable
class UnmaskRule(Protocol):
    """Decides which slots of a diffusion LM's canvas to commit this step (:func:`decodekit.dlm.generate`).
    Optional: ``begin_block(state)``, called when a block starts (schedules); ``per_row_steps = True``, a promise that
    a row's commits depend only on that row (its step in the block read from ``state.steps_in_block()``, never
    ``state.step`` or ``state.progress``) and that a row with no eligible slot gets none, so that with drafts each row
    may take its own number of steps a forward. Any diffusion part may define ``check_model(dlm)``, called when a call
    starts, before any forward: raise a :class:`~decodekit.errors.ConfigError` for a setting the model cannot take
    (token ids outside its vocabulary). What the parts return is checked (:mod:`decodekit.dlm.components`)."""

    def select(self, state: DLMState, proposal: Proposal, eligible: torch.Tensor) -> torch.Tensor:
        """``[B, G]`` bool: the slots to commit with ``proposal.tokens``. ``eligible [B, G]``: the masked slots of
        the current block; a rule may commit other masked slots too (Prophet fills them all; EoTStop fills the tail
        after an end-of-text token, replacing those slots' ``proposal.tokens``), and must commit at least one slot of
        every row that has an eligible one (the loop checks)."""
        ...


@runtime_checkable
class DLMCache(Protocol):
    """How a diffusion sampler's step gets its logits: recompute, or reuse K/V kept from an earlier forward.
    Optional: ``begin(state)``, called when a :func:`decodekit.dlm.generate` call starts (drop an earlier call's
    K/V); ``logits_many(dlm, state, canvases)``, several canvases in one forward (what drafts need); ``lookahead =
    True``, a promise that ``logits_many`` also computes the block ``state.lookahead`` names when it is set
    (:mod:`decodekit.dlm.lookahead`)."""

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
    takes several of the sampler's own steps; the output does not change. Optional: ``finishes(left) -> bool``,
    whether the drafts may finish the block of a row with ``left`` masked slots in it; when it says so for some
    row, the loop looks ahead (``state.lookahead``, :mod:`decodekit.dlm.lookahead`)."""

    def variants(self, state: DLMState, proposal: Proposal, committed: torch.Tensor, left: int) -> torch.Tensor | None:
        """``[1 + D, B, T]``: ``state.canvas`` first, then the canvases drafted for the next ``D`` steps (each
        ``state.canvas`` with more slots of the current block committed); None = no drafts this time. ``proposal``
        and ``committed [B, G]``: the step just taken; ``left``: the most masked slots a row has left in its block.
        A canvas that commits all of a row's is of use only while ``state.lookahead`` is set."""
        ...


@runtime_checkable
class RegionSchedule(Protocol):
    """Which slots of a diffusion LM's canvas a step may commit, and when a block ends (:func:`decodekit.dlm.generate`).
    ``fixed_blocks``: whether every row is in the same block ``state.block`` (the K/V-keeping caches need it).
    Optional: ``next_block(state) -> (start, end) | None``, the block after ``state.block`` (drafts may then look
    ahead into it: :mod:`decodekit.dlm.lookahead`)."""

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
class Begins(Protocol):
    def begin(self, state: DecodeState) -> None:
        """Called once per call after prefill, with the state holding the first pending token."""
        ...


@runtime_checkable
class SharesTarget(Protocol):
    """A drafter that drafts with the target itself (its first layers, heads on its hidden states)."""

    shares_target: bool

    def begin(self, state: DecodeState, target: LanguageModel, cache: KVCache) -> None:
        """Receives the target adapter and its cache, committed up to (not including) each pending token.

        The drafter may stage draft tokens into this cache past each row's committed length
        (``cache.stage(n, offset=j)``); the verification forward stages at offset 0 and overwrites them.
        A drafter whose ``needs`` has ``"prefill"`` gets ``begin(state, target, cache, prefill=...)``: the
        prefill's :class:`~decodekit.models.base.ModelOutput` (with ``needs`` "hidden": ``last_hidden [B, T, H]``
        of every prompt token, and the ``hidden_layers`` asked for).
        """
        ...


@runtime_checkable
class Observes(Protocol):
    def observe(self, state: DecodeState, round: Round) -> None:
        """Called after every round, once ``state`` holds the round's committed tokens."""
        ...


@runtime_checkable
class SelectsRows(Protocol):
    def select_rows(self, rows: torch.Tensor) -> None:
        """Rows finished: keep only ``rows [B']`` (indices into the current batch) of any per-row state. A
        component whose ``needs`` has ``"host_rows"`` gets ``select_rows(rows, host_rows=...)``: the same indices as
        Python ints (no host sync needed to read them; ``ModelDrafter`` hands them to its cache)."""
        ...


@runtime_checkable
class Needs(Protocol):
    needs: frozenset[str]


@runtime_checkable
class DeclaresKind(Protocol):
    def draft_kind(self, sampling: SamplingParams) -> DraftKind:
        """The kind of every draft this drafter will produce under ``sampling``."""
        ...


@runtime_checkable
class HasVocab(Protocol):
    vocab_size: int


@runtime_checkable
class ChecksModel(Protocol):
    def check_model(self, target: LanguageModel) -> None:
        """Raise :class:`~decodekit.errors.ConfigError` if this drafter cannot draft for ``target`` (called when a
        call starts, before any forward)."""
        ...


@runtime_checkable
class HasDefaultPolicy(Protocol):
    def default_policy(self) -> LengthPolicy:
        """The length policy :func:`decodekit.generate` uses with this drafter when the call names none."""
        ...


@runtime_checkable
class ChecksSampling(Protocol):
    def check(self, sampling: SamplingParams) -> None:
        """Raise :class:`~decodekit.errors.ConfigError` if this verifier cannot honour ``sampling``."""
        ...


_COMMON = ("begin", "observe", "select_rows", "needs", "hidden_layers")
HOOKS = {
    "drafter": ("propose", *_COMMON, "shares_target", "draft_kind", "vocab_size", "default_policy", "check_model"),
    "verifier": ("verify", "accepts", "lossless", "check", *_COMMON),
    "policy": ("plan", *_COMMON),
}
"""Every method or attribute name the loop looks for, per role (typo warnings compare against these)."""
