"""Prophet: commit every remaining slot at once when the model is already sure."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from decodekit.checks import check_choice, check_float, check_instance
from decodekit.dlm.interfaces import BeginsBlock, UnmaskRule, flag
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
    threshold of the current stage, every masked slot of the generation region, later blocks included, takes its
    current proposal and the row is done. Until then the ``base`` rule decides. The stage follows the row's
    progress counted as the reference (one row a call) counts it, the current step included: at a row's ``k``-th
    step (``k = 1`` first) the progress is ``k / steps``, and the gap needed is ``7.5`` while it is below 0.33,
    ``5.0`` below 0.67 and ``2.5`` after. Under a cache that does not predict every slot each step (``dual`` and
    ``block_causal`` predict the current block only), later blocks have no proposal: they neither count in the gap
    nor get filled, so the all-in commit fills the rest of what was predicted, and decoding goes on with the next
    block.

    Faithfulness: the step counting, the staged thresholds (0.33 / 0.67) and the all-in fill follow the reference
    code (pixeli99/Prophet ``generate_earlyexit.py`` at 460afe41c7063a29a9893675aca07b985997bb83; token for token
    in ``tests/unit/test_dlm_reference.py``); its gap is averaged over 5 fixed answer slots pinned by a task prompt,
    which we generalise to a ``region`` (all masked slots, or the current block's) and a ``reduce`` (``"mean"``, or
    ``"min"``: every slot sure). The reference's base step ranks float32 confidences, decodekit's float64 ones (the
    same order unless two slots tie in float32). Lossy.

    Args:
        base: the rule before the trigger, an instance (default :class:`~decodekit.dlm.rules.llada.LLaDARule`).
        thresholds: logit gaps per stage (finite). stages: progress where each stage after the first begins
            (increasing, in ``[0, 1]``).
        region: ``"masked"`` or ``"block"``. reduce: ``"mean"`` or ``"min"``.
    """

    def __init__(
        self,
        base: Any = None,
        thresholds: Sequence[float] = (7.5, 5.0, 2.5),
        stages: Sequence[float] = (0.33, 0.67),
        region: str = "masked",
        reduce: str = "mean",
    ) -> None:
        check_instance("base", base, UnmaskRule, what="an unmasking rule with select(state, proposal, eligible)")
        self.base = LLaDARule() if base is None else base
        self.thresholds = tuple(check_float(f"thresholds[{i}]", t) for i, t in enumerate(thresholds))
        self.stages = tuple(check_float(f"stages[{i}]", s, low=0.0, high=1.0) for i, s in enumerate(stages))
        if len(self.thresholds) != len(self.stages) + 1 or list(self.stages) != sorted(self.stages):
            raise ConfigError(
                f"Prophet needs one threshold per stage, len(thresholds) == len(stages) + 1, stages increasing; got "
                f"thresholds={self.thresholds}, stages={self.stages}"
            )
        self.region, self.reduce = check_choice("region", region, REGIONS), check_choice("reduce", reduce, REDUCTIONS)

    @property
    def fixed_blocks(self) -> bool:
        """Whether the base rule needs the same blocks in every row (a schedule that gives rows their own is then
        refused)."""
        return flag(self.base, "fixed_blocks")

    def begin_block(self, state: DLMState) -> None:
        if isinstance(self.base, BeginsBlock):
            self.base.begin_block(state)

    def threshold(self, progress: float) -> float:
        """The gap needed at ``progress`` (0..1): the first stage's below ``stages[0]``, and so on."""
        return self.thresholds[sum(progress >= s for s in self.stages)]

    @staticmethod
    def progress(state: DLMState) -> list[float]:
        """Each row's progress at the step being taken, counted as the reference counts it (one row a call): the
        row's steps so far, this one included, over its step budget, ``(row_steps[b] + 1) / total_steps`` (the
        reference increments its counter before the step; ``state.row_total_steps`` where rows have budgets of their
        own). Counted per row, a row's stages do not depend on how many steps its batch mates took."""
        budgets = state.row_total_steps or [state.total_steps] * len(state.row_steps)
        return [(n + 1) / max(t, 1) for n, t in zip(state.row_steps, budgets)]

    def select(self, state: DLMState, proposal: Proposal, eligible: torch.Tensor) -> torch.Tensor:
        masked = state.masked & proposal.predicted  # a cache's unpredicted slots (later blocks) count for nothing
        region = masked if self.region == "masked" else eligible & masked
        gap = proposal.logit_gap()
        if self.reduce == "mean":
            score = (gap * region).sum(1) / region.sum(1).clamp(min=1)
        else:
            score = gap.masked_fill(~region, float("inf")).amin(1)
        needed = [self.threshold(p) for p in self.progress(state)]  # a copy to the device only when rows differ
        limit = needed[0] if len(set(needed)) == 1 else torch.tensor(needed, device=score.device, dtype=score.dtype)
        sure = region.any(1) & (score >= limit)
        return torch.where(sure[:, None], masked, self.base.select(state, proposal, eligible))
