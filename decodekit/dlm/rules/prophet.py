"""Prophet: commit every remaining slot at once when the model is already sure."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from decodekit.checks import check_choice
from decodekit.dlm.rules.llada import LLaDARule
from decodekit.dlm.state import DLMState, Proposal
from decodekit.errors import ConfigError
from decodekit.registry import register

REGIONS = ("masked", "block")
REDUCTIONS = ("mean", "min")


@register("dlm_rule", "prophet")
class ProphetRule:
    """Early all-in commit (Prophet, Li et al. 2025, "Diffusion Language Models Know the Answer Before Decoding"):
    each step, the top-1 minus top-2 **logit** gap of the proposals is reduced over a region; once it reaches the
    threshold of the current stage (progress = steps taken / the call's ``steps``: ``7.5`` before 1/3, ``5.0``
    before 2/3, ``2.5`` after), every masked slot of the generation region, later blocks included, takes its current
    proposal and the row is done. Until then the ``base`` rule decides. Under a cache that does not predict every
    slot each step (``dual`` and ``block_causal`` predict the current block only), later blocks have no proposal:
    they neither count in the gap nor get filled, so the all-in commit fills the rest of what was predicted, and
    decoding goes on with the next block.

    Faithfulness: the staged thresholds and the all-in fill follow the reference code (pixeli99/Prophet); its gap
    is averaged over 5 fixed answer slots pinned by a task prompt, which we generalise to a ``region`` (all masked
    slots, or the current block's) and a ``reduce`` (``"mean"``, or ``"min"``: every slot sure). Lossy.

    Args:
        base: the rule before the trigger (default :class:`~decodekit.dlm.rules.llada.LLaDARule`).
        thresholds: logit gaps per stage. stages: progress where each stage after the first begins.
        region: ``"masked"`` or ``"block"``. reduce: ``"mean"`` or ``"min"``.
    """

    def __init__(
        self,
        base: Any = None,
        thresholds: Sequence[float] = (7.5, 5.0, 2.5),
        stages: Sequence[float] = (1 / 3, 2 / 3),
        region: str = "masked",
        reduce: str = "mean",
    ) -> None:
        self.base = LLaDARule() if base is None else base
        self.thresholds, self.stages = tuple(float(t) for t in thresholds), tuple(float(s) for s in stages)
        if len(self.thresholds) != len(self.stages) + 1 or list(self.stages) != sorted(self.stages):
            raise ConfigError(
                f"Prophet needs one threshold per stage, len(thresholds) == len(stages) + 1, stages increasing; got "
                f"thresholds={self.thresholds}, stages={self.stages}"
            )
        self.region, self.reduce = check_choice("region", region, REGIONS), check_choice("reduce", reduce, REDUCTIONS)

    def begin_block(self, state: DLMState) -> None:
        if hasattr(self.base, "begin_block"):
            self.base.begin_block(state)

    def threshold(self, progress: float) -> float:
        """The gap needed at ``progress`` (0..1)."""
        return self.thresholds[sum(progress >= s for s in self.stages)]

    def select(self, state: DLMState, proposal: Proposal, eligible: torch.Tensor) -> torch.Tensor:
        masked = state.masked & proposal.predicted  # a cache's unpredicted slots (later blocks) count for nothing
        region = masked if self.region == "masked" else eligible & masked
        gap = proposal.logit_gap()
        if self.reduce == "mean":
            score = (gap * region).sum(1) / region.sum(1).clamp(min=1)
        else:
            score = gap.masked_fill(~region, float("inf")).amin(1)
        sure = region.any(1) & (score >= self.threshold(state.progress))
        return torch.where(sure[:, None], masked, self.base.select(state, proposal, eligible))
