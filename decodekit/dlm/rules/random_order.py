"""LLaDA's random remasking with the decode order drawn once per block, so the next step's commits are known."""

from __future__ import annotations

import torch

from decodekit.dlm.rules.common import transfer_counts
from decodekit.dlm.state import DLMState, Proposal
from decodekit.registry import register
from decodekit.sampling import uniform


@register("dlm_rule", "random_order")
class RandomOrderRule:
    """Random remasking, planned: when a block starts, each row's masked slots in it get a uniformly random order;
    step ``i`` commits the next ``counts[i]`` slots of that order (LLaDA's per-step counts,
    :func:`~decodekit.dlm.rules.common.transfer_counts`). After each step it publishes the slots it will commit at
    the next one in ``state.planned`` (``[B, G]`` bool), which dKV-Cache-Greedy
    (:class:`~decodekit.dlm.caches.DKVGreedyCache`) feeds instead of the whole canvas.

    The same sampler as ``LLaDARule("random")`` in distribution: that rule draws fresh uniform scores every step and
    commits the top ``counts[i]`` of the block's masked slots, a uniformly random subset of them independent of the
    proposals; consecutive chunks of one uniform order are such subsets too (``tests/unit/test_dlm_greedy.py``
    checks the first commits' frequencies for both). The draws differ, so a seed does not give the same output.

    Faithfulness: the order drawn once per block and the per-step counts follow horseee/dKV-Cache
    ``llada_dkv_cache_greedy.py`` (``remasking='random'``). Needs fixed blocks (every row in ``state.block``).
    """

    plans = True  # publishes state.planned
    fixed_blocks = True
    per_row_steps = True  # reads each row's step from state.steps_in_block()

    def __init__(self) -> None:
        self.rank: torch.Tensor | None = None  # [B, G] position of each masked block slot in the order (else G)
        self.bounds: torch.Tensor | None = None  # [B, steps + 1] cumulative commits: step i takes [bounds[i], [i+1])

    def begin_block(self, state: DLMState) -> None:
        masked = state.masked & state.in_block
        counts = transfer_counts(masked.sum(1), max(state.block_steps, 1))
        self.bounds = torch.cat([counts.new_zeros(len(counts), 1), counts.cumsum(1)], 1)
        score = uniform(tuple(masked.shape), state.generator, state.device, key="order").masked_fill(~masked, -1.0)
        order = score.argsort(dim=1, descending=True, stable=True)  # masked block slots first, in random order
        places = torch.arange(masked.shape[1], device=state.device).expand_as(order)
        rank = torch.empty_like(order).scatter_(1, order, places)
        self.rank = rank.masked_fill(~masked, masked.shape[1])

    def select(self, state: DLMState, proposal: Proposal, eligible: torch.Tensor) -> torch.Tensor:
        if self.rank is None:  # a caller's own loop that does not call begin_block
            self.begin_block(state)
        assert self.rank is not None and self.bounds is not None
        step, end = state.steps_in_block(), self.bounds.shape[1] - 2
        commit = self._due(step.clamp(max=end)) & eligible
        # the plan's end reads the loop's step, not each row's: only dKV-Cache-Greedy reads plans, and it runs
        # without drafts, where every row's step is state.step (a host int: no device read)
        state.planned = None if state.step + 1 > end else self._due((step + 1).clamp(max=end))
        return commit

    def _due(self, step: torch.Tensor) -> torch.Tensor:
        """``[B, G]`` bool: the slots of the order that each row's step ``step [B]`` of the block commits."""
        assert self.rank is not None and self.bounds is not None
        lo, hi = self.bounds.gather(1, step[:, None]), self.bounds.gather(1, step[:, None] + 1)
        return (self.rank >= lo) & (self.rank < hi)
