"""Fast-dLLM's factor-based parallel unmasking."""

from __future__ import annotations

import torch

from decodekit.checks import check_float
from decodekit.dlm.rules.common import top_per_row
from decodekit.dlm.state import DLMState, Proposal
from decodekit.registry import register


@register("dlm_rule", "factor")
class FactorRule:
    """Commit each row's ``n`` most confident masked slots of the block, ``n`` the longest prefix of the sorted
    confidences ``c_1 >= c_2 >= ...`` with ``c_j >= 1 - factor / (j + 1)`` for every ``j <= n`` (at least 1) (Wu et
    al. 2025, "Fast-dLLM": if every selected marginal exceeds ``1 - eps`` with ``(n + 1) eps <= 1``, greedy decoding
    of the product of marginals equals that of the joint).

    Faithfulness: the paper's rule (``(n + 1)(1 - c_n) < f``); the reference code (``get_transfer_index_dynamic``)
    also takes every slot when the first failing rank is the last one, a quirk not reproduced; otherwise token for
    token with it (``tests/unit/test_dlm_reference.py``, checked against NVlabs/Fast-dLLM ``llada/generate.py`` at
    f6b35ec3f1b16e1b3d3357938046559ae2d350fa). Lossy, as :class:`~decodekit.dlm.rules.threshold.ThresholdRule`.

    Args:
        factor: ``f`` (1.0 in the paper; larger commits more per step).
    """

    per_row_steps = True  # reads no step counter

    def __init__(self, factor: float = 1.0) -> None:
        self.factor = check_float("factor", factor, low=0.0, low_open=True)

    def select(self, state: DLMState, proposal: Proposal, eligible: torch.Tensor) -> torch.Tensor:
        conf = proposal.confidence.masked_fill(~eligible, float("-inf"))
        ranked = conf.sort(dim=-1, descending=True).values
        j = torch.arange(1, conf.shape[1] + 1, device=conf.device, dtype=conf.dtype)
        passing = ranked >= 1 - self.factor / (j + 1)
        passing[:, 0] = True
        n = passing.long().cumprod(-1).sum(-1)
        return top_per_row(proposal.confidence, eligible, n)
