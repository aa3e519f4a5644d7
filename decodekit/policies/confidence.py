"""Stop drafting when the drafter's confidence in its last token falls below a threshold."""

from __future__ import annotations

import torch

from decodekit.checks import check_float, check_int
from decodekit.registry import register
from decodekit.spec.state import DecodeState
from decodekit.types import DraftBudget, DraftStep


@register("policy", "confidence")
class ConfidenceStop:
    """transformers' ``assistant_confidence_threshold`` (fixed threshold): a step-wise drafter stops after a
    token whose draft probability is below ``threshold`` (that token is kept), and never drafts more than
    ``max_len``. Drafters that do not draft step by step (n-gram) are bounded by ``max_len`` only.
    """

    def __init__(self, threshold: float = 0.4, max_len: int = 20) -> None:
        self.threshold = check_float("threshold", threshold, low=0, high=1, hint=" (a probability)")
        self.max_len = check_int("max_len", max_len, low=1)

    def stop(self, step: DraftStep) -> torch.Tensor:
        return step.token_probs < self.threshold

    def stop_top1(self, step: DraftStep) -> torch.Tensor:
        """The same test on the drafter's top-1 probability (GammaTune+), which is the drafted token's in greedy
        drafting and may be higher when it samples."""
        top1 = step.token_probs if step.probs is None else step.probs.amax(-1)
        return top1 < self.threshold

    def plan(self, state: DecodeState) -> DraftBudget:
        return DraftBudget.uniform(state.lengths, self.max_len, stop=self.stop)
