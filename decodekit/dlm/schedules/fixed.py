"""The semi-autoregressive baseline: the region cut into equal blocks, the same for every row, left to right."""

from __future__ import annotations

from collections.abc import Iterator

import torch

from decodekit.dlm.model import DLMModel
from decodekit.dlm.state import DLMState, Proposal
from decodekit.registry import register


@register("dlm_schedule", "fixed")
class FixedBlocks:
    """``G / block_length`` blocks of ``block_length`` slots, decoded left to right, each with ``steps / blocks``
    steps of budget (LLaDA's ``generate.py``; ``schedule=None``). Every row is in the same block, so the cache
    strategies that keep a block's K/V (``prefix``, ``dual``, ``block_causal``) can read ``state.block``."""

    fixed_blocks = True

    def rounds(self, dlm: DLMModel, state: DLMState) -> Iterator[None]:
        for b in range(state.gen_length // state.block_length):
            state.block = (b * state.block_length, (b + 1) * state.block_length)
            state.block_steps, state.step = state.steps_per_block, 0
            yield

    def region(self, state: DLMState, proposal: Proposal) -> torch.Tensor:
        return state.in_block

    def next_block(self, state: DLMState) -> tuple[int, int] | None:
        """``(start, end)`` of the block after ``state.block`` (None after the last): where a drafted forward may look
        ahead (:mod:`decodekit.dlm.lookahead`)."""
        end = state.block[1]
        return (end, end + state.block_length) if end < state.gen_length else None
