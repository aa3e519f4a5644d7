"""Dream's unmasking: commits on a ``linspace(1, eps)`` time grid, the slots with the highest confidence."""

from __future__ import annotations

import torch

from decodekit.checks import check_choice, check_float
from decodekit.dlm.rules.common import top_per_row
from decodekit.dlm.state import DLMState, Proposal, spread
from decodekit.registry import register
from decodekit.sampling import Generator, RowGenerators, uniform

ALGS = ("origin", "maskgit_plus", "topk_margin", "entropy")
NEVER = 2**62  # "origin": the rank of a slot that no step commits


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


def origin_plan(masked: torch.Tensor, steps: int, eps: float, generator: Generator) -> torch.Tensor:
    """``[B, G]`` long: the step of Dream's ``alg="origin"`` at which each ``masked [B, G]`` slot commits (``-1``:
    not masked), drawn as the reference draws it.

    Step ``i`` of ``steps`` commits each still-masked slot with probability ``1 - t[i + 1] / t[i]`` on
    ``t = linspace(1, eps, steps + 1)`` (float32; every slot left at the last step): the reference's
    ``torch.rand(n) < p_transfer`` over its ``n`` masked slots, which does not depend on the model, so the whole plan
    is drawn when the block starts. With one ``torch.Generator`` (or torch's global one) the draws are the
    reference's, one ``torch.rand`` a step over the batch's masked slots row by row (its ``x[mask_index]``); with
    per-row seeds (:class:`~decodekit.sampling.RowGenerators`) each row draws from its own stream (the same law)."""
    grid = torch.linspace(1, eps, steps + 1, device=masked.device)
    left, when = masked.clone(), torch.full(masked.shape, -1, dtype=torch.long, device=masked.device)
    for i in range(steps):
        if i == steps - 1:
            hit = left
        else:
            p = 1 - grid[i + 1] / grid[i]
            hit = left & (_draws(left, generator) < p)
        when = when.masked_fill(hit, i)
        left = left & ~hit
    return when


def _draws(left: torch.Tensor, generator: Generator) -> torch.Tensor:
    """``[B, G]`` uniforms at the ``left [B, G]`` slots (1 elsewhere): one ``torch.rand(n)`` over the batch's ``n``
    left slots, row by row, as the reference draws over ``x[mask_index]``; a keyed ``[B, G]`` draw from per-row
    generators."""
    if isinstance(generator, RowGenerators):
        return uniform(tuple(left.shape), generator, left.device, key="origin")
    out = torch.ones(left.shape, device=left.device)
    out[left] = torch.rand(int(left.sum()), generator=generator, device=left.device)  # a host read a step
    return out


@register("dlm_rule", "dream")
class DreamRule:
    """Dream's ``diffusion_generate`` (Dream-org/Dream ``generation_utils.py``, ``_sample``) with a deterministic
    ``alg``: on the block's ``S`` steps, step ``i`` commits ``int(n (1 - t_{i+1} / t_i))`` of the row's ``n`` masked
    slots on the grid ``t = linspace(1, eps, S + 1)`` (every one left at the last step), those with the highest
    confidence: the top probability (``"maskgit_plus"``), the gap between the top two (``"topk_margin"``) or the
    negative entropy (``"entropy"``), from ``softmax`` of the slot's logits in float32 as the reference computes them.

    ``alg="origin"`` (the reference's default): step ``i`` commits each masked slot with probability
    ``1 - t_{i+1} / t_i`` (all left at the last step), whatever the model says, so the plan is drawn when the block
    starts (:func:`origin_plan`) and published a step ahead in ``state.planned``; each slot takes the token proposed
    at the step it commits (the argmax at temperature 0).

    Faithfulness: at temperature 0, one block (``block_length = gen_length``, as ``diffusion_generate`` runs), token
    for token the reference (``tests/unit/test_dlm_families.py`` compares it with a port of ``_sample`` on a tiny
    Dream checkpoint; ``"origin"`` with ``seed=<int>`` against the port drawing from a generator of that seed, as
    ``torch.manual_seed`` sets the reference's); differences, by design: steps that commit nothing are skipped (the
    same tokens, fewer forwards), the deterministic algorithms' counts are per row (the reference averages the
    masked count over the batch), and ties go to the earlier slot. At temperature > 0 the same law with decodekit's
    own draws of the tokens. Not implemented: ``alg_temp > 0`` (slots drawn from the confidences).

    Host syncs: ``"origin"`` reads the batch's masked count at each of the block's steps, when the block starts
    (one generator; none with per-row seeds); the others one read a block.

    Args:
        alg: ``"origin"``, ``"maskgit_plus"``, ``"topk_margin"`` or ``"entropy"``.
        eps: the time grid's end (the reference's default 1e-3).
    """

    per_row_steps = True  # reads each row's step from state.steps_in_block()

    def __init__(self, alg: str = "entropy", eps: float = 1e-3) -> None:
        self.alg = check_choice("alg", alg, ALGS)
        self.plans = self.alg == "origin"  # publishes state.planned (dKV-Cache-Greedy reads it)
        self.eps = check_float("eps", eps, low=0.0, high=1.0, low_open=True, high_open=True)
        self.counts: torch.Tensor | None = None  # [B, K]
        self.rank: torch.Tensor | None = None  # "origin": [B, G] the row's nonempty step each slot commits at

    def begin_block(self, state: DLMState) -> None:
        masked = state.masked & state.in_block
        if self.alg == "origin":
            when = origin_plan(masked, max(state.block_steps, 1), self.eps, state.generator)
            used = torch.zeros(len(when), max(state.block_steps, 1) + 1, dtype=torch.long, device=when.device)
            used.scatter_(1, when.clamp(min=-1) + 1, 1)  # column 0: unmasked slots
            steps = used[:, 1:].cumsum(1) - 1  # the rank of each reference step among the row's nonempty ones
            self.rank = steps.gather(1, when.clamp(min=0)).masked_fill(when < 0, NEVER)
            return
        counts = masked.sum(1).tolist()  # one host read a block: the schedule follows
        self.counts = dream_counts(counts, max(state.block_steps, 1), self.eps).to(state.device)

    def select(self, state: DLMState, proposal: Proposal, eligible: torch.Tensor) -> torch.Tensor:
        if self.alg == "origin":
            return self._origin(state, eligible)
        if self.counts is None:
            self.begin_block(state)
        assert self.counts is not None
        step = state.steps_in_block().clamp(max=self.counts.shape[1] - 1)
        count = self.counts.gather(1, step[:, None])[:, 0]
        count = torch.where(count > 0, count, eligible.sum(1))  # past the schedule: what is left
        return top_per_row(self.confidence(proposal), eligible, count)

    def _origin(self, state: DLMState, eligible: torch.Tensor) -> torch.Tensor:
        """The planned slots of each row's step (and any earlier ones another part left: a row with eligible slots
        always commits its next planned ones)."""
        if self.rank is None:
            self.begin_block(state)
        assert self.rank is not None
        rank = self.rank.masked_fill(~eligible, NEVER)
        due = torch.maximum(state.steps_in_block(), rank.min(1).values)  # [B]
        state.planned = (self.rank == due[:, None] + 1) & state.masked
        return eligible & (rank <= due[:, None])

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
