"""LocalLeap: relaxed thresholds near confident anchors."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from decodekit.checks import check_float, check_int
from decodekit.dlm.rules.common import most_confident
from decodekit.dlm.state import DLMState, Proposal
from decodekit.errors import ConfigError
from decodekit.registry import register


@register("dlm_rule", "local_leap")
class LocalLeapRule:
    """Fast-dLLM's threshold rule, relaxed near anchors (LocalLeap, arXiv 2510.07081): masked slots of the block with
    confidence ``>= threshold`` are anchors; slots within ``radius`` of an anchor commit at ``>= relaxed``, others
    at ``>= threshold``; each row's most confident slot always commits. Without anchors it is
    :class:`~decodekit.dlm.rules.threshold.ThresholdRule`.

    Faithfulness: the rule of the authors' code as read (one flat radius; the paper's distance-dependent decay
    would be a ``relaxed(d)``); lossy.

    Args:
        threshold: ``tau`` (0.9). relaxed: ``tau_relaxed`` near anchors (0.75). radius: slots either side (4).
    """

    per_row_steps = True  # reads no step counter

    def __init__(self, threshold: float = 0.9, relaxed: float = 0.75, radius: int = 4) -> None:
        self.threshold = check_float("threshold", threshold, low=0.0, high=1.0)
        self.relaxed = check_float("relaxed", relaxed, low=0.0, high=1.0)
        if self.relaxed > self.threshold:
            raise ConfigError(f"relaxed ({relaxed}) must not exceed threshold ({threshold}): it relaxes it")
        self.radius = check_int("radius", radius, low=0)

    def select(self, state: DLMState, proposal: Proposal, eligible: torch.Tensor) -> torch.Tensor:
        conf = proposal.confidence
        anchors = eligible & (conf >= self.threshold)
        width = 2 * self.radius + 1
        near = F.max_pool1d(anchors.float()[:, None], width, stride=1, padding=self.radius)[:, 0] > 0
        leap = eligible & near & (conf >= self.relaxed)
        return anchors | leap | most_confident(conf, eligible)
