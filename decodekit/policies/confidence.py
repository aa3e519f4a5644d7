"""Stop drafting when the drafter's confidence in its last token falls below a threshold."""

from __future__ import annotations

import torch

from decodekit.errors import ConfigError
from decodekit.registry import register
from decodekit.state import DecodeState
from decodekit.types import DraftBudget, DraftStep


@register("policy", "confidence")
class ConfidenceStop:
    """transformers' ``assistant_confidence_threshold`` (fixed threshold): a step-wise drafter stops after a
    token whose draft probability is below ``threshold`` (that token is kept), and never drafts more than
    ``max_len``. Drafters that do not draft step by step (n-gram) are bounded by ``max_len`` only.
    """

    def __init__(self, threshold: float = 0.4, max_len: int = 20) -> None:
        if not 0.0 <= threshold <= 1.0:
            raise ConfigError(f"threshold must be a probability in [0, 1], got {threshold}")
        if max_len < 1:
            raise ConfigError(f"max_len must be >= 1, got {max_len}")
        self.threshold, self.max_len = threshold, max_len

    def stop(self, step: DraftStep) -> torch.Tensor:
        return step.token_probs < self.threshold

    def plan(self, state: DecodeState) -> DraftBudget:
        return DraftBudget(torch.full_like(state.lengths, self.max_len), stop=self.stop, node_bound=self.max_len)
