"""A drafter that drafts each row with the first of two drafters that proposes something for it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from decodekit.checks import check_instance, check_int
from decodekit.drafters.recycling import RecyclingDrafter
from decodekit.drafters.suffix import SuffixDrafter
from decodekit.errors import ConfigError, IncompatibleDraftError
from decodekit.interfaces import (
    DeclaresKind,
    Drafter,
    HasVocab,
    LengthPolicy,
    Needs,
    Observes,
    SelectsRows,
    hidden_layers_of,
    shares_target,
)
from decodekit.policies.fixed import policy_for
from decodekit.registry import register
from decodekit.spec.hooks import begin_component, select_component_rows
from decodekit.spec.state import DecodeState
from decodekit.types import Draft, DraftBudget, DraftKind, SamplingParams

if TYPE_CHECKING:
    from decodekit.cache import KVCache
    from decodekit.models.base import LanguageModel, ModelOutput
    from decodekit.spec.round import Round


@register("drafter", "fallback")
class FallbackDrafter:
    """Row ``b`` gets ``primary``'s draft, or ``fallback``'s where ``primary`` proposes no node for it.

    The idea: a lookup drafter that drafts well when it finds a match and nothing otherwise (``suffix``,
    ``ngram``), backed by one that always has a guess (a trained head, ``recycling``, a draft model), since on free
    text most rounds find no match. SuffixDecoding's hybrid mode (Oliaro et al. 2024) pairs suffix trees with a
    model-based speculator the same way, switching on a score threshold; here the switch is an empty row (no
    threshold was measured). On SmolLM2 on the 2-core CPU (docs/benchmarks.md), suffix backed by the EAGLE-3 head
    (recipe ``drafter=lookup_eagle3``) is the fastest drafter decodekit has, ahead of both its parts on every task;
    backed by recycling it gains nothing measurable over suffix alone (a cold recycling matrix never knows the token
    suffix has no match for).

    Lookup drafters want long drafts and model-based ones short ones: ``fallback_len`` caps the depth of the
    fallback's budget only (``policy.k=16 policy.depth=16`` for suffix, ``fallback_len=3`` for the head).

    Both drafters see every hook (``begin``, ``observe``, ``select_rows``, ``clear``), so each keeps its own state
    whichever drafted. ``needs`` and ``hidden_layers`` are the union of theirs. Each row's draft is one of the
    two drafters' drafts, within the budget, so every verifier that takes their kind keeps its guarantee
    (lossless stays lossless). Cost: the fallback runs only when some row got nothing, where that is known without
    a device sync: the primary built its draft on the host and said how many nodes each row has
    (``Draft.knowing_counts``: suffix lookup), or its draft lives on the CPU. Otherwise, on an accelerator, both
    run every round. Rows are merged on the device (:meth:`Draft.where`), and when both drafts declared their
    width the merged one declares the larger as a bound, so the loop trims it without a read.

    Args:
        primary: the drafter tried first; None = ``SuffixDrafter()``.
        fallback: the drafter for the rows ``primary`` leaves empty; its drafts must be of the same kind. None =
            ``RecyclingDrafter("smollm2_8")``.
        fallback_len: the deepest node (a chain's length) the fallback may draft; None = the policy's budget.

    A part that drafts from the target (``shares_target``: a trained head, early exit) gets the target, its cache
    and the prefill's output in ``begin``; one that did not draft in a round still observes it (an EAGLE head
    catches up on the features it missed at its next draft).

    Raises:
        ConfigError: a drafter does not declare its draft kind (``draft_kind``), the two have different
            vocabularies, or ``fallback_len`` is not a positive integer.
    """

    def __init__(
        self, primary: Drafter | None = None, fallback: Drafter | None = None, fallback_len: int | None = None
    ) -> None:
        primary = SuffixDrafter() if primary is None else primary
        fallback = RecyclingDrafter("smollm2_8") if fallback is None else fallback
        for name, part in (("primary", primary), ("fallback", fallback)):
            check_instance(
                f"FallbackDrafter's {name}", part, Drafter, what="a propose(state, budget) method", optional=False
            )
            if not isinstance(part, DeclaresKind):
                raise ConfigError(
                    f"FallbackDrafter's {name} ({type(part).__name__}) must declare draft_kind(sampling), so the two "
                    "can be checked to draft one kind before anything runs"
                )
        self.primary, self.fallback = primary, fallback
        self.fallback_len = check_int("fallback_len", fallback_len, low=1, optional=True, hint=" (None = the budget's)")
        self.parts = (primary, fallback)
        # a part drafting from the target (a trained head on its hidden states, its first layers) gets the target in
        # begin, so this drafter asks for it too
        self.shares_target = any(shares_target(p) for p in self.parts)
        self.needs = frozenset({"host_rows"}).union(*(p.needs for p in self.parts if isinstance(p, Needs)))
        self.hidden_layers = tuple(sorted({int(i) for p in self.parts for i in hidden_layers_of(p)}))
        sizes = {int(p.vocab_size) for p in self.parts if isinstance(p, HasVocab)}
        if len(sizes) > 1:
            raise ConfigError(f"FallbackDrafter's drafters have different vocabularies: {sorted(sizes)} tokens")
        if sizes:  # checked against the target's by generate(); model-free drafters take any vocabulary
            self.vocab_size = sizes.pop()

    def draft_kind(self, sampling: SamplingParams) -> DraftKind:
        first, second = (p.draft_kind(sampling) for p in self.parts)  # type: ignore[attr-defined]
        if first != second:
            raise IncompatibleDraftError(
                f"FallbackDrafter's primary drafts {first.value} trees and its fallback {second.value} ones under "
                f"{sampling}; a round is verified as one kind: pick drafters of one kind (e.g. two model-free ones)"
            )
        return first

    def default_policy(self) -> LengthPolicy:
        """The policy ``generate`` would give the primary alone (suffix: 16 nodes up to 16 deep)."""
        return policy_for(self.primary)

    def check_model(self, target: LanguageModel) -> None:
        """Each part's own refusal of ``target`` (an EAGLE-3 head trained for another), before any forward."""
        for part in self.parts:
            check = getattr(part, "check_model", None)
            if callable(check):
                check(target)

    # ------------------------------------------------------------------------------------------------ hooks
    def begin(
        self,
        state: DecodeState,
        target: LanguageModel | None = None,
        cache: KVCache | None = None,
        prefill: ModelOutput | None = None,
    ) -> None:
        """Begin both parts; a part that shares the target gets it, its cache and the prefill's output (the loop
        passes them when either part shares the target)."""
        for part in self.parts:
            begin_component(part, state, target, cache, prefill)  # type: ignore[arg-type]

    def observe(self, state: DecodeState, round: Round) -> None:
        for part in self.parts:
            if isinstance(part, Observes):
                part.observe(state, round)

    def select_rows(self, rows: torch.Tensor, host_rows: list[int] | None = None) -> None:
        for part in self.parts:
            if isinstance(part, SelectsRows):
                select_component_rows(part, rows, host_rows)

    def clear(self) -> None:
        """Clear what either drafter keeps across calls (a suffix cache, a successor matrix)."""
        for part in self.parts:
            clear: Any = getattr(part, "clear", None)
            if callable(clear):
                clear()

    # ---------------------------------------------------------------------------------------------- drafting
    def propose(self, state: DecodeState, budget: DraftBudget) -> Draft:
        first = self.primary.propose(state, budget)
        if first.num_nodes == 0:
            return self.fallback.propose(state, self._fallback_budget(budget))
        drafted = first.valid.any(-1)  # [B]
        if first.host_counts is not None:  # a draft built on the host (suffix lookup) says which rows drafted
            everyone = all(first.host_counts)
        else:
            everyone = drafted.device.type == "cpu" and bool(drafted.all())  # known without a device sync
        if everyone:
            return first
        second = self.fallback.propose(state, self._fallback_budget(budget))
        if second.num_nodes == 0:
            return first
        return first.where(drafted, second)

    def _fallback_budget(self, budget: DraftBudget) -> DraftBudget:
        """``budget`` with its depth capped at ``fallback_len``."""
        if self.fallback_len is None:
            return budget
        return budget.capped_at(self.fallback_len)
