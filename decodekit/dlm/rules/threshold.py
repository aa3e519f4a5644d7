"""Fast-dLLM's confidence-threshold parallel unmasking."""

from __future__ import annotations

import torch

from decodekit.checks import check_float
from decodekit.dlm.rules.common import most_confident
from decodekit.dlm.state import DLMState, Proposal
from decodekit.registry import register


@register("dlm_rule", "threshold")
class ThresholdRule:
    """Commit every masked slot of the block whose confidence is at least ``threshold``, and always each row's most
    confident one (Wu et al. 2025, "Fast-dLLM", confidence-aware parallel decoding). A block then takes as many
    steps as it needs (at most its length), not the ``steps`` budget.

    Faithfulness: the rule of the reference code (NVlabs/Fast-dLLM ``get_transfer_index`` with ``threshold``: ``>=``,
    plus the forced top-1), token for token with it uncached and under both caches
    (``tests/unit/test_dlm_reference.py``, checked against ``llada/generate.py`` at
    f6b35ec3f1b16e1b3d3357938046559ae2d350fa). Lossy: slots committed together are drawn from their marginals, not
    jointly.

    Args:
        threshold: confidence needed to commit a slot beside the row's most confident one (0.9 in the paper).
    """

    per_row_steps = True  # reads no step counter

    def __init__(self, threshold: float = 0.9) -> None:
        self.threshold = check_float("threshold", threshold, low=0.0, high=1.0)

    def select(self, state: DLMState, proposal: Proposal, eligible: torch.Tensor) -> torch.Tensor:
        sure = eligible & (proposal.confidence >= self.threshold)
        return sure | most_confident(proposal.confidence, eligible)
