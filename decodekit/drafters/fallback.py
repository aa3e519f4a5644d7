"""A drafter that drafts each row with the first of two drafters that proposes something for it."""

from __future__ import annotations

from decodekit.checks import check_instance, check_int
from decodekit.drafters.composite import Composite
from decodekit.drafters.recycling import RecyclingDrafter
from decodekit.drafters.suffix import SuffixDrafter
from decodekit.errors import ConfigError, IncompatibleDraftError
from decodekit.interfaces import DeclaresKind, Drafter, LengthPolicy
from decodekit.policies.fixed import policy_for
from decodekit.registry import register
from decodekit.spec.state import DecodeState
from decodekit.types import Draft, DraftBudget, DraftKind, SamplingParams


@register("drafter", "fallback")
class FallbackDrafter(Composite):
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

    Both drafters see every hook (``begin``, ``observe``, ``select_rows``, ``clear``:
    :class:`~decodekit.drafters.composite.Composite`), so each keeps its own state whichever drafted. ``needs`` and
    ``hidden_layers`` are the union of theirs. Each row's draft is one of the
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
        self.compose((primary, fallback), "FallbackDrafter")

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
