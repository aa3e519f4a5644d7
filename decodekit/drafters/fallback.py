"""A drafter that drafts each row with the first of two drafters that proposes something for it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from decodekit.checks import check_instance
from decodekit.components import takes_keyword
from decodekit.drafters.recycling import RecyclingDrafter
from decodekit.drafters.suffix import SuffixDrafter
from decodekit.errors import ConfigError, IncompatibleDraftError
from decodekit.interfaces import Begins, DeclaresKind, Drafter, HasVocab, Needs, Observes, SelectsRows
from decodekit.registry import register
from decodekit.state import DecodeState
from decodekit.types import Draft, DraftBudget, DraftKind, SamplingParams

if TYPE_CHECKING:
    from decodekit.round import Round


@register("drafter", "fallback")
class FallbackDrafter:
    """Row ``b`` gets ``primary``'s draft, or ``fallback``'s where ``primary`` proposes no node for it.

    The idea: a lookup drafter that drafts well when it finds a match and nothing otherwise (``suffix``,
    ``ngram``), backed by one that always has a guess (``recycling``, a draft model), since on free text most
    rounds find no match. SuffixDecoding's hybrid mode (Oliaro et al. 2024) pairs suffix trees with a model-based
    speculator the same way, switching on a score threshold; here the switch is an empty row (no threshold was
    measured). On SmolLM2 on a 2-core CPU it gains nothing measurable over suffix alone (docs/benchmarks.md): a
    cold recycling fallback never knows the token suffix has no match for, and a hot one adds tokens only on code,
    at more verified positions; the int8 draft model as fallback is slower.

    Both drafters see every hook (``begin``, ``observe``, ``select_rows``, ``clear``), so each keeps its own state
    whichever drafted. ``needs`` and ``hidden_layers`` are the union of theirs. Each row's draft is one of the
    two drafters' drafts, within the budget, so every verifier that takes their kind keeps its guarantee
    (lossless stays lossless). Cost: where the primary's draft lives on the CPU the fallback runs only when some
    row got nothing (deciding costs no host sync); on an accelerator both run every round and rows are merged on
    the device (:meth:`Draft.where`), since asking which rows are empty would cost a host sync.

    Args:
        primary: the drafter tried first (any drafter that does not share the target); None =
            ``SuffixDrafter()``.
        fallback: the drafter for the rows ``primary`` leaves empty; its drafts must be of the same kind. None =
            ``RecyclingDrafter("smollm2_8")``.

    Raises:
        ConfigError: a drafter shares the target (it would need the target's cache, which the two cannot share),
            does not declare its draft kind (``draft_kind``), or the two have different vocabularies.
    """

    def __init__(self, primary: Drafter | None = None, fallback: Drafter | None = None) -> None:
        primary = SuffixDrafter() if primary is None else primary
        fallback = RecyclingDrafter("smollm2_8") if fallback is None else fallback
        for name, part in (("primary", primary), ("fallback", fallback)):
            check_instance(
                f"FallbackDrafter's {name}", part, Drafter, what="a propose(state, budget) method", optional=False
            )
            if getattr(part, "shares_target", False):
                raise ConfigError(
                    f"FallbackDrafter's {name} ({type(part).__name__}) shares the target's cache; combine drafters "
                    "that draft on their own (model-free drafters, a separate draft model)"
                )
            if not isinstance(part, DeclaresKind):
                raise ConfigError(
                    f"FallbackDrafter's {name} ({type(part).__name__}) must declare draft_kind(sampling), so the two "
                    "can be checked to draft one kind before anything runs"
                )
        self.primary, self.fallback = primary, fallback
        self.parts = (primary, fallback)
        self.needs = frozenset().union(*(p.needs for p in self.parts if isinstance(p, Needs)))
        self.hidden_layers = tuple(sorted({int(i) for p in self.parts for i in getattr(p, "hidden_layers", ())}))
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

    # ------------------------------------------------------------------------------------------------ hooks
    def begin(self, state: DecodeState) -> None:
        for part in self.parts:
            if isinstance(part, Begins):
                part.begin(state)

    def observe(self, state: DecodeState, round: Round) -> None:
        for part in self.parts:
            if isinstance(part, Observes):
                part.observe(state, round)

    def select_rows(self, rows: torch.Tensor, host_rows: list[int] | None = None) -> None:
        for part in self.parts:
            if not isinstance(part, SelectsRows):
                continue
            if host_rows is not None and takes_keyword(part.select_rows, "host_rows"):
                part.select_rows(rows, host_rows=host_rows)  # type: ignore[call-arg]
            else:
                part.select_rows(rows)

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
            return self.fallback.propose(state, budget)
        drafted = first.valid.any(-1)  # [B]
        if drafted.device.type == "cpu" and bool(drafted.all()):  # known without a device sync
            return first
        second = self.fallback.propose(state, budget)
        if second.num_nodes == 0:
            return first
        return first.where(drafted, second)
