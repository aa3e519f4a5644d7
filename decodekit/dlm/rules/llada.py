"""LLaDA's baseline unmasking: a fixed number of commits per step, the most confident (or random) slots."""

from __future__ import annotations

import torch

from decodekit.checks import check_choice
from decodekit.dlm.rules.common import top_per_row, transfer_counts
from decodekit.dlm.state import DLMState, Proposal
from decodekit.registry import register
from decodekit.sampling import uniform

REMASKING = ("low_confidence", "random")


@register("dlm_rule", "llada")
class LLaDARule:
    """The reference sampler's rule (ML-GSAI/LLaDA ``generate.py``; what :func:`decodekit.dlm.generate` uses with
    ``rule=None``): when a block starts, each row's masked slots in it are spread over the block's steps
    (:func:`~decodekit.dlm.rules.common.transfer_counts`: equal counts, the remainder on the first steps); each step
    commits that many of the block's masked slots, those whose proposal has the highest confidence
    (``"low_confidence"`` remasking: the probability of the proposed token) or uniformly random ones (``"random"``).
    A step commits at least one slot while the row has an eligible one (past the counts, or under a sliding window
    such as :class:`~decodekit.dlm.schedules.DeferredWindow` that brings in slots the counts did not spread).

    Faithfulness: the schedule, the per-row top-k over the block and both remasking modes follow the reference code
    exactly (at temperature 0 the output is token-for-token the reference's; ``tests/unit/test_dlm.py`` compares it
    with an independent transcription of the reference loop, ``tests/unit/test_dlm_reference.py`` with Fast-dLLM's
    ``generate`` at f6b35ec3f1b16e1b3d3357938046559ae2d350fa); confidences rank in float64 as there; ties between
    equal confidences go to the earlier slot.

    Args:
        remasking: ``"low_confidence"`` or ``"random"``.
    """

    per_row_steps = True  # reads each row's step from state.steps_in_block()

    def __init__(self, remasking: str = "low_confidence") -> None:
        self.remasking = check_choice("remasking", remasking, REMASKING)
        self.counts: torch.Tensor | None = None  # [B, block steps]

    def begin_block(self, state: DLMState) -> None:
        masked = (state.masked & state.in_block).sum(1)
        self.counts = transfer_counts(masked, max(state.block_steps, 1))

    def select(self, state: DLMState, proposal: Proposal, eligible: torch.Tensor) -> torch.Tensor:
        if self.counts is None:
            self.begin_block(state)
        assert self.counts is not None
        step = state.steps_in_block().clamp(max=self.counts.shape[1] - 1)  # past the schedule: keep the last count
        # at least one commit while a row has eligible slots: the counts spread the slots masked when the block began,
        # and a sliding window (DCD) brings new ones in after them
        count = torch.where(eligible.any(1), self.counts.gather(1, step[:, None])[:, 0].clamp(min=1), 0)
        score = proposal.confidence
        if self.remasking == "random":
            score = uniform(tuple(eligible.shape), state.generator, eligible.device, key="order")
        return top_per_row(score, eligible, count)
