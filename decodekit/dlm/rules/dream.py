"""Dream's unmasking: commits on a ``linspace(1, eps)`` time grid, the slots with the highest confidence."""

from __future__ import annotations

import torch

from decodekit.checks import check_choice, check_float
from decodekit.dlm.rules.common import top_per_row
from decodekit.dlm.state import DLMState, Proposal, spread
from decodekit.registry import register

ALGS = ("maskgit_plus", "topk_margin", "entropy")


def dream_counts(masked: list[int], steps: int, eps: float) -> torch.Tensor:
    """``[B, K]`` long: each row's commits per step on Dream's time grid, steps that commit nothing left out.

    ``diffusion_generate`` takes ``t = linspace(1, eps, steps + 1)`` (float32) and, at step ``i`` with ``n`` masked
    slots, commits ``int(n (1 - t[i + 1] / t[i]))`` of them (all of them at the last step), computed in float32 as
    there; a step whose count is 0 changes nothing at temperature 0, so it is dropped (the reference spends a forward
    on it). Rows shorter than ``K`` are padded with zeros."""
    grid = torch.linspace(1, eps, steps + 1)
    ratio = 1 - grid[1:] / grid[:-1]  # [steps] float32, the share of the masked slots step i commits
    left = torch.tensor(masked, dtype=torch.long)
    counts = torch.zeros(len(masked), steps, dtype=torch.long)
    for i in range(steps):  # the reference's int(): truncation of a float32 product
        counts[:, i] = left if i == steps - 1 else (left.float() * ratio[i]).long()
        left = left - counts[:, i]
    order = (counts == 0).to(torch.int8).sort(dim=1, stable=True).indices  # each row's nonzero steps first
    counts = counts.gather(1, order)
    return counts[:, : max(1, int((counts > 0).sum(1).max()))]


@register("dlm_rule", "dream")
class DreamRule:
    """Dream's ``diffusion_generate`` (Dream-org/Dream ``generation_utils.py``, ``_sample``) with a deterministic
    ``alg``: on the block's ``S`` steps, step ``i`` commits ``int(n (1 - t_{i+1} / t_i))`` of the row's ``n`` masked
    slots on the grid ``t = linspace(1, eps, S + 1)`` (every one left at the last step), those with the highest
    confidence: the top probability (``"maskgit_plus"``), the gap between the top two (``"topk_margin"``) or the
    negative entropy (``"entropy"``), from ``softmax`` of the slot's logits in float32 as the reference computes them.

    Faithfulness: at temperature 0, one block (``block_length = gen_length``, as ``diffusion_generate`` runs) and
    one row, token for token the reference (``tests/unit/test_dlm_families.py`` compares it with a port of ``_sample``
    on a tiny Dream checkpoint); differences, by design: steps whose count is 0 are skipped (the same tokens, fewer
    forwards), the counts are per row (the reference averages the masked count over the batch), and ties go to the
    earlier slot. Not implemented: ``alg="origin"`` (the reference's default: which slots commit is drawn with
    ``torch.rand`` each step) and ``alg_temp > 0`` (slots drawn from the confidences).

    Args:
        alg: ``"maskgit_plus"``, ``"topk_margin"`` or ``"entropy"``.
        eps: the time grid's end (the reference's default 1e-3).
    """

    per_row_steps = True  # reads each row's step from state.steps_in_block()

    def __init__(self, alg: str = "entropy", eps: float = 1e-3) -> None:
        self.alg = check_choice("alg", alg, ALGS)
        self.eps = check_float("eps", eps, low=0.0, high=1.0, low_open=True, high_open=True)
        self.counts: torch.Tensor | None = None  # [B, K]

    def begin_block(self, state: DLMState) -> None:
        masked = (state.masked & state.in_block).sum(1).tolist()  # one host read a block: the schedule follows
        self.counts = dream_counts(masked, max(state.block_steps, 1), self.eps).to(state.device)

    def select(self, state: DLMState, proposal: Proposal, eligible: torch.Tensor) -> torch.Tensor:
        if self.counts is None:
            self.begin_block(state)
        assert self.counts is not None
        step = state.steps_in_block().clamp(max=self.counts.shape[1] - 1)
        count = self.counts.gather(1, step[:, None])[:, 0]
        count = torch.where(count > 0, count, eligible.sum(1))  # past the schedule: what is left
        return top_per_row(self.confidence(proposal), eligible, count)

    def confidence(self, proposal: Proposal) -> torch.Tensor:
        """``[B, G]`` float32: the reference's confidence of each predicted slot (``-inf`` elsewhere)."""
        probs = proposal.logits.float().softmax(-1)
        if self.alg == "maskgit_plus":
            score = probs.max(-1).values
        elif self.alg == "topk_margin":
            top = probs.topk(2, dim=-1).values
            score = top[..., 0] - top[..., 1]
        else:
            score = (probs * torch.log(probs + 1e-10)).sum(-1)
        return spread(score, proposal.lo, proposal.tokens.shape[1], float("-inf"))
