"""SDAR's remasking strategies: a fixed count per step, or every slot above a confidence threshold."""

from __future__ import annotations

import torch

from decodekit.checks import check_choice, check_float
from decodekit.dlm.rules.common import top_per_row
from decodekit.dlm.state import DLMState, Proposal
from decodekit.registry import register

STRATEGIES = ("low_confidence_dynamic", "low_confidence_static", "sequential")


@register("dlm_rule", "sdar")
class SDARRule:
    """SDAR's ``block_diffusion_generate`` rule (Cheng et al. 2025, JetAstra/SDAR ``generate.py``): a block of ``L``
    slots over ``s`` steps commits ``n_t`` slots at step ``t`` (``L // s`` each, the remainder one each on the first
    steps: counted on the block's length, not on its masked slots); which ones:

    - ``"low_confidence_dynamic"`` (SDAR's default): every masked slot whose confidence exceeds ``threshold``
      when there are at least ``n_t`` of them, else the ``n_t`` most confident;
    - ``"low_confidence_static"``: the ``n_t`` most confident;
    - ``"sequential"``: the first ``n_t`` masked slots, left to right.

    Confidence is the proposed token's probability (:class:`~decodekit.dlm.state.Proposal`). Runs on any model; made
    for SDAR's block-causal checkpoints (:mod:`decodekit.dlm.families.sdar`).

    Faithfulness: ``tests/unit/test_dlm_families.py`` compares the tokens with a port of ``block_diffusion_generate``
    (JetAstra/SDAR @ c2041a8) on a tiny SDAR checkpoint: ``"sequential"`` at the reference's own greedy setting
    (``top_k=1``), and the two confidence strategies with the reference's sampler replaced by the argmax and its
    softmax probability, which is what this rule proposes at temperature 0 (the reference has no temperature 0: its
    greedy ``top_k=1`` makes every confidence 1, so its dynamic strategy then commits a whole block in one step).
    Where the reference's top-k asks for more slots than are still masked it overwrites committed ones with fresh
    proposals; this rule commits masked slots only (the two agree whenever ``n_t`` never exceeds the masked slots
    left, e.g. ``steps = L``, SDAR's 4 / 4 default). Its ``"entropy_bounded"`` strategy is not implemented (the
    reference sums the chosen tokens' probabilities across the block before ranking, which leaves nothing to rank
    per slot). At a temperature other than 0 or 1 the reference ranks by the tempered probability, this rule by the
    untempered one. Lossy, as every parallel unmasking rule.

    Args:
        strategy: one of ``"low_confidence_dynamic"``, ``"low_confidence_static"``, ``"sequential"``.
        threshold: the dynamic strategy's confidence bar (strictly above; 0.85 in SDAR's ``generate.py``).
    """

    per_row_steps = True  # reads each row's step from state.steps_in_block()

    def __init__(self, strategy: str = "low_confidence_dynamic", threshold: float = 0.85) -> None:
        self.strategy = check_choice("strategy", strategy, STRATEGIES)
        self.threshold = check_float("threshold", threshold, low=0.0, high=1.0)

    def counts(self, state: DLMState) -> torch.Tensor:
        """``[B]`` long: ``n_t`` for each row's current step (past the block's budget: the last step's)."""
        steps = max(state.block_steps, 1)
        length = state.block[1] - state.block[0] if state.region is None else state.block_length
        step = state.steps_in_block().clamp(max=steps - 1)
        return length // steps + (step < length % steps).long()

    def select(self, state: DLMState, proposal: Proposal, eligible: torch.Tensor) -> torch.Tensor:
        n = self.counts(state)
        if self.strategy == "sequential":
            order = -torch.arange(eligible.shape[1], device=eligible.device, dtype=torch.float64)
            return top_per_row(order.expand(eligible.shape), eligible, n)
        top = top_per_row(proposal.confidence, eligible, n)
        if self.strategy == "low_confidence_static":
            return top
        sure = eligible & (proposal.confidence > self.threshold)
        return torch.where((sure.sum(1) >= n)[:, None], sure, top)
