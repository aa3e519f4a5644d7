"""Fast-dLLM v2's decoding within a block: the first slot autoregressively, then sub-blocks by a threshold."""

from __future__ import annotations

import torch

from decodekit.checks import check_float, check_int
from decodekit.dlm.rules.common import most_confident
from decodekit.dlm.state import DLMState, Proposal
from decodekit.registry import register


@register("dlm_rule", "fast_dllm_v2")
class FastDLLMv2Rule:
    """Fast-dLLM v2's ``generate`` (Wu et al. 2025, "Fast-dLLM v2"): a block whose first slot is still masked
    commits that slot alone, the argmax of the previous position's output (with the model's shifted logits: the
    token an AR step would give, which the reference takes from the forward that stores the previous block); then
    the block is decoded in sub-blocks of ``sub_block`` slots, left to right, each step committing the current
    sub-block's masked slots whose confidence exceeds ``threshold`` and always its most confident one.

    Runs on any model; made for Fast-dLLM v2's block-causal, shifted checkpoints
    (:mod:`decodekit.dlm.families.fast_dllm_v2`), whose blocks sit on the absolute grid (a prompt's tail opens the
    first block: no AR slot there).

    Faithfulness: ``tests/unit/test_dlm_families.py`` compares the tokens with a port of ``generate`` (the
    ``modeling.py`` copy named in :mod:`decodekit.dlm.families.fast_dllm_v2`; temperature 0, no sub-block cache) on a
    tiny Fast-dLLM v2 checkpoint. Not implemented: its ``use_block_cache`` (a sub-block cache that reuses the block's
    K/V across steps, approximate), its stop-token early exit (the loop generates every slot), and its
    ``top_p`` sampling (``temperature > 0`` here draws from the full softmax). Where a prompt is exactly one block
    long the reference runs the first block without the prompt in its cache; here the prompt is seen. Lossy, as
    every parallel unmasking rule.

    Args:
        threshold: confidence a slot needs beside its sub-block's most confident one (strictly above; the
            reference's ``generate`` defaults to 1, i.e. one slot a step).
        sub_block: the sub-block length (``small_block_size``: 8); must divide the block length.
    """

    per_row_steps = True  # reads no step counter

    def __init__(self, threshold: float = 0.9, sub_block: int = 8) -> None:
        self.threshold = check_float("threshold", threshold, low=0.0, high=1.0)
        self.sub_block = check_int("sub_block", sub_block, low=1)

    def select(self, state: DLMState, proposal: Proposal, eligible: torch.Tensor) -> torch.Tensor:
        lo = state.block[0]
        slot = torch.arange(eligible.shape[1], device=eligible.device)
        if lo < eligible.shape[1]:
            ar = eligible[:, lo]  # [B]: the block's first slot is open: an AR step
        else:
            ar = torch.zeros(len(eligible), dtype=torch.bool, device=eligible.device)
        sub = torch.div(slot - lo, self.sub_block, rounding_mode="floor")
        current = torch.where(eligible, sub, slot.numel()).min(1).values  # [B] each row's first open sub-block
        window = eligible & (sub == current[:, None])
        pick = (window & (proposal.confidence > self.threshold)) | most_confident(proposal.confidence, window)
        return torch.where(ar[:, None], eligible & (slot == lo), pick)
