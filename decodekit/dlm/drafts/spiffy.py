"""Spiffy-style auto-speculation: the diffusion LM's own proposals draft the canvases of the next steps."""

from __future__ import annotations

from itertools import combinations

import torch

from decodekit.checks import check_int
from decodekit.dlm.state import DLMState, Proposal
from decodekit.registry import register


@register("dlm_draft", "spiffy")
class SpiffyDrafts:
    """Draft the canvases the next steps may reach, from the last step's proposals, for the loop to verify in one
    forward (Agrawal et al. 2025, "Spiffy: Multiplying Diffusion LLM Acceleration via Lossless Speculative
    Decoding").

    After a step commits, each row's ``width`` most confident slots still masked in the block (by that step's
    proposals) are the candidates; every set of 1 to ``depth`` candidates, committed with their proposed tokens, is
    a drafted canvas (``sum_k C(width, k)`` of them: 7 at the defaults). A set names a canvas whatever the order its
    slots were committed in, so the drafts form a directed graph in which each step moves to a set one or more
    candidates larger: the sampler may commit the candidates in any order, several a step or one, and stay on it.
    :func:`decodekit.dlm.generate` runs the canvas and the drafts in one forward (the cache's ``logits_many``), takes
    the sampler's own step on the canvas, and while the canvas a row reached is one of the drafts takes the next
    step on that draft's output: each forward takes ``1 +`` (steps that stayed on the graph) steps.

    **Lossless**: every step is the sampler's own (its rule, proposals from the canvas it is on, its per-row random
    draws), so the output is the undrafted sampler's token for token with per-row seeds, in distribution otherwise;
    only the forward count changes (``tests/unit/test_dlm_drafts.py``).

    Faithfulness: Spiffy's verification (a drafted block state is accepted when the sampler's own next state equals
    it, and the accepted draft's output is the next step's) and its order-free draft graph over the most confident
    masked slots. Not reproduced: the offline calibration that picks which of the graph's nodes to keep (here: all
    sets up to ``depth``), and drafting alternative tokens for a slot (here: its proposed token only). Rows advance
    together, one step at a time for all of them; the forward's steps end when any live row leaves the graph.

    Cost: a forward runs ``1 +`` (nodes) canvases (the block's slots only with the block-causal cache, whole
    canvases under recompute). It pays where a forward's time barely grows with its width (a GPU at small batch);
    on a CPU the forwards fall and the wall time rises.

    Args:
        width: candidate slots per row (the most confident masked ones).
        depth: the most candidates a drafted canvas commits (at most ``width``).
    """

    fixed_blocks = True  # drafts within state.block: every row in the same block

    def __init__(self, width: int = 3, depth: int = 3) -> None:
        self.width = check_int("width", width, low=1)
        self.depth = check_int("depth", depth, low=1, high=self.width, hint=" (at most width)")

    def variants(self, state: DLMState, proposal: Proposal, committed: torch.Tensor, left: int) -> torch.Tensor | None:
        """``[1 + N, B, T]``: ``state.canvas``, then the ``N`` drafted canvases (None when no draft can help: a
        row's last step needs none). ``proposal`` and ``committed [B, G]``: the step just taken (unused: any rule's
        step count works); ``left``: the most masked slots a row has left in its block (a host int)."""
        depth = min(self.depth, left - 1)
        if depth < 1:
            return None
        open_ = state.masked & state.in_block & proposal.predicted
        score = proposal.confidence.masked_fill(~open_, float("-inf"))
        ranked = score.argsort(dim=1, descending=True, stable=True)[:, : self.width]  # [B, width] slot indices
        usable = open_.gather(1, ranked)  # a row with fewer open slots repeats a smaller set: harmless
        index = state.slots
        current = state.canvas.gather(1, index)  # [B, G]
        out = [state.canvas]
        for size in range(1, depth + 1):
            for chosen in combinations(range(ranked.shape[1]), size):
                pick = torch.zeros_like(open_).scatter(1, ranked[:, chosen], usable[:, chosen])
                out.append(state.canvas.scatter(1, index, torch.where(pick, proposal.tokens, current)))
        return torch.stack(out)


__all__ = ["SpiffyDrafts"]
