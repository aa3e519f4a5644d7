"""Spiffy-style auto-speculation: the diffusion LM's own proposals draft the canvases of the next steps."""

from __future__ import annotations

from itertools import combinations, product
from typing import Any

import torch

from decodekit.checks import check_bool, check_choice, check_int
from decodekit.dlm.drafts.graphs import DraftGraph, Node, check_graph
from decodekit.dlm.state import DLMState, Proposal
from decodekit.errors import ConfigError
from decodekit.registry import register

SCORES = ("geometric", "product")  # how pruning ranks nodes (SpiffyDrafts.scores)


@register("dlm_draft", "spiffy")
class SpiffyDrafts:
    """Draft the canvases the next steps may reach, from the last step's proposals, for the loop to verify in one
    forward (Agrawal et al. 2025, "Spiffy: Multiplying Diffusion LLM Acceleration via Lossless Speculative
    Decoding").

    After a step commits, each row's ``width`` most confident slots still masked in the block (by that step's
    proposals) are the candidates; every set of 1 to ``depth`` candidates (or each set of a calibrated ``graph``),
    committed with their proposed tokens, is a drafted canvas (``sum_k C(width, k)`` of them: 7 at the defaults). A
    set names a canvas whatever the order its slots were committed in, so the drafts form a directed graph in which
    each step moves to a set one or more candidates larger: the sampler may commit the candidates in any order,
    several a step or one, and stay on it.
    :func:`decodekit.dlm.generate` runs the canvas and the drafts in one forward (the cache's ``logits_many``), takes
    the sampler's own step on the canvas, and while the canvas a row reached is one of the drafts takes the next
    step on that draft's output: each forward takes ``1 +`` (steps that stayed on the graph) steps.

    **Lossless**: every step is the sampler's own (its rule, proposals from the canvas it is on, its per-row random
    draws), so the output is the undrafted sampler's token for token with per-row seeds, in distribution otherwise;
    only the forward count changes (``tests/unit/test_dlm_drafts.py``).

    Faithfulness: Spiffy's verification (a drafted block state is accepted when the sampler's own next state equals
    it, and the accepted draft's output is the next step's) and its order-free draft graph over the most confident
    masked slots; its offline calibration of which nodes to keep in the spirit of the paper, not its procedure
    (:func:`~decodekit.dlm.drafts.calibrate.calibrate_graph`: a greedy pick over the sampler's recorded walks). The
    pruning during inference (``keep``) follows the paper's v4 as second-hand accounts give it (its text was not
    available here): each node's local score is the geometric mean of its tokens' probabilities, combined by a
    geometric mean with its children's score, and each step keeps the top nodes; taking the best child's score
    (and a node's own score where it has no child) is our reading. A graph may also draft a candidate with one of
    its other likely tokens by the step's logits (an element ``[r, j]``; not claimed to be the paper's choice of
    alternatives): on the zoo DLM most walks that stop do so because the next steps commit a candidate with another
    token than the one proposed now (docs/benchmarks.md). In a batch each row walks its own graph: it steps on while
    its canvas is one of its drafts and waits for the next forward when not (with a rule that declares
    ``per_row_steps``; other rules keep the rows in step).

    Cost: a forward runs ``1 +`` (nodes) canvases, ``1 + keep`` when pruned (the block's slots only with the
    block-causal cache, whole canvases under recompute). It pays where a forward's time barely grows with its width
    (a GPU at small batch); on a CPU the forwards fall and the wall time rises.

    Args:
        width: candidate slots per row (the most confident masked ones); default 3.
        depth: the most candidates a drafted canvas commits (at most ``width``); default 3.
        graph: instead of every set up to ``depth``, the sets to draft, as lists of candidate ranks (0 = the most
            confident), such as :func:`~decodekit.dlm.drafts.calibrate.calibrate_graph` picks from recorded runs
            (Spiffy's offline calibration), or the name of a zoo model's calibrated graph (``CALIBRATED_GRAPHS``);
            ``width`` and ``depth`` then follow from it. An element ``r`` commits candidate ``r`` with its proposed
            token, a pair ``[r, j]`` with its ``j``-th most likely other token (``[r, 0]`` is ``r``).
        alternatives: without a graph, also draft each set with every choice of its candidates' tokens among the
            proposed one and the ``alternatives`` most likely others (``sum_k C(width, k) (1 + alternatives)^k``
            canvases); default 0.
        budget: draft only the graph's first ``budget`` nodes (a calibration lists the most useful first; a forward
            runs ``1 + budget`` canvases); default all.
        keep: prune during inference: after each step, each row drafts only the ``keep`` nodes of the graph that
            score best on that step's probabilities (:meth:`scores`), so a forward runs ``1 + keep`` canvases
            whatever the graph's size; default None (every node). Which nodes a row keeps follows its logits, so in
            a batch float rounding can tip a near tie and a row's forwards differ a little from its count alone (its
            tokens never do).
        score: how ``keep`` ranks nodes: ``"geometric"`` (the paper's geometric means, default) or ``"product"``
            (the product of the drafted tokens' probabilities); :meth:`scores`.
        lookahead: when a row's last masked slots fit in a node, also draft the canvases that finish its block and
            have the forward compute the next block on them, so a row that finishes on one takes the next block's
            first step without a forward (:mod:`decodekit.dlm.lookahead`; a schedule with ``next_block`` and a
            cache with ``lookahead``); default True. Such a forward runs twice the width per canvas with the
            block-causal cache.
    """

    fixed_blocks = True  # drafts within state.block: every row in the same block

    def __init__(
        self,
        width: int | None = None,
        depth: int | None = None,
        graph: Any = None,
        budget: int | None = None,
        alternatives: int | None = None,
        keep: int | None = None,
        score: str = "geometric",
        lookahead: bool = True,
    ) -> None:
        self.lookahead = check_bool("lookahead", lookahead)
        self.keep = check_int("keep", keep, low=1, optional=True, hint=" (drafted canvases a forward after pruning)")
        self.score = check_choice("score", score, SCORES)
        if self.keep is None and score != SCORES[0]:
            raise ConfigError(f"score={score!r} ranks the nodes that keep= keeps: pass keep=<drafts a forward> too")
        if budget is not None and graph is None:
            raise ConfigError("budget takes the first nodes of a graph: pass graph=[...] or a calibrated graph's name")
        if graph is None:
            self.width = check_int("width", 3 if width is None else width, low=1)
            self.depth = check_int(
                "depth", 3 if depth is None else depth, low=1, high=self.width, hint=" (at most width)"
            )
            choices = range(check_int("alternatives", alternatives or 0, low=0) + 1)
            nodes = [
                tuple(zip(slots, picks))
                for k in range(1, self.depth + 1)
                for slots in combinations(range(self.width), k)
                for picks in product(choices, repeat=k)
            ]
        elif width is not None or depth is not None or alternatives is not None:
            raise ConfigError(
                "SpiffyDrafts takes a graph or width, depth and alternatives, not both (a graph sets them)"
            )
        else:
            nodes = check_graph(graph)
            if budget is not None:
                nodes = nodes[: check_int("budget", budget, low=1)]
            self.width, self.depth = max(r for n in nodes for r, _ in n) + 1, max(map(len, nodes))
        self.alternatives = max(j for n in nodes for _, j in n)  # other tokens a slot may take (0: the proposed)
        self.nodes: list[Node] = sorted(nodes, key=lambda n: (len(n), n))
        self._tensors: DraftGraph | None = None

    def variants(self, state: DLMState, proposal: Proposal, committed: torch.Tensor, left: int) -> torch.Tensor | None:
        """``[1 + N, B, T]``: ``state.canvas``, then the ``N`` drafted canvases (None when no draft can help: a
        row's last step needs none, unless the loop looks ahead). ``proposal`` and ``committed [B, G]``: the step
        just taken (unused: any rule's step count works); ``left``: the most masked slots a row has left in its block
        (a host int). With ``keep``, ``N = keep`` and each row drafts its own best-scored nodes (:meth:`scores`)."""
        depth = min(self.depth, left if state.lookahead else left - 1)  # a finished block: only to look ahead
        if depth < 1:
            return None
        # a row with fewer candidates keeps its unusable ones masked, so repeats a smaller set: harmless
        ranked, usable, tokens = candidates(state, proposal, self.width, self.alternatives)
        graph = self._graph(state.device)
        room, fits = graph.fitting(depth, left)  # the nodes the rows can still use (sizes, candidates)
        if not len(room):
            return None
        if self.keep is None:  # every node that fits, the same for each row
            chosen = room.expand(state.batch_size, -1)  # [B, N']
        else:
            score = self.scores(proposal, ranked, usable, tokens, graph, fits)
            chosen = score.topk(min(self.keep, len(room)), dim=1).indices  # [B, K]
        return torch.cat([state.canvas[None], graph.canvases(state, ranked, usable, tokens, chosen)])

    def finishes(self, left: int) -> bool:
        """Whether the drafts may finish the block of a row with ``left`` masked slots in it (every set of them fits
        in a node), so that the loop looks ahead into the next block (:mod:`decodekit.dlm.lookahead`)."""
        return self.lookahead and left <= self.depth

    def scores(
        self,
        proposal: Proposal,
        ranked: torch.Tensor,
        usable: torch.Tensor,
        tokens: torch.Tensor,
        graph: DraftGraph,
        fits: torch.Tensor,
    ) -> torch.Tensor:
        """``[B, N]`` each node's score for this step (higher: more likely on the sampler's walk), ``-1`` for nodes
        past ``fits [N]``, from the probabilities of the tokens a node drafts (the untempered ``softmax`` of the
        step's logits; 0 for an unusable candidate). ``score="geometric"``: their geometric mean, then, from the
        largest sets down, the geometric mean of that and the best score among the node's children (the sets one
        candidate larger), so a node on the way to a likely larger set ranks with it (Spiffy v4's pruning, in our
        reading: class docstring). ``score="product"``: their product, the chance that every drafted token is
        committed as drafted if they were independent; a set never outscores its subsets, so the nodes kept are
        each reachable one slot at a time."""
        logp = slot_logits(proposal, ranked).log_softmax(-1).gather(-1, tokens)  # [B, W, J]
        logp = logp.masked_fill(~usable[..., None], float("-inf"))  # an unusable candidate: probability 0
        picked = logp[:, graph.ranks, graph.picks].masked_fill(~graph.valid, 0.0)  # [B, N, D]
        if self.score == "product":
            return picked.sum(-1).exp().masked_fill(~fits, -1.0)
        local = (picked.sum(-1) / graph.sizes).exp()  # [B, N]: geometric mean
        score = local.masked_fill(~fits, -1.0)
        # the largest sets first: their scores are final when their parents read them
        for level, children in reversed(list(zip(graph.levels, graph.children))):
            padded = torch.cat([score, score.new_full((score.shape[0], 1), -1.0)], 1)  # column N: no child
            child = padded[:, children].amax(-1)  # [B, n]: -1 where no child fits
            mixed = torch.where(child >= 0, (local[:, level] * child.clamp(min=0)).sqrt(), local[:, level])
            score[:, level] = mixed.masked_fill(~fits[level], -1.0)
        return score

    def _graph(self, device: torch.device) -> DraftGraph:
        """The nodes as index tensors on ``device`` (built once per device)."""
        if self._tensors is None or self._tensors.ranks.device != device:
            self._tensors = DraftGraph(self.nodes, device)
        return self._tensors


def candidates(
    state: DLMState, proposal: Proposal, width: int, alternatives: int = 0
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Each row's ``width`` candidates after a step: ``[B, width]`` slot indices of the block's masked slots, most
    confident first by ``proposal``; ``[B, width]`` bool, which of them are such slots (a row with fewer has
    ``False`` after its last); and ``[B, width, 1 + alternatives]`` the tokens each may take: its proposed one,
    then the ``alternatives`` most likely others by the step's logits."""
    open_ = state.masked & state.in_block & proposal.predicted
    score = proposal.confidence.masked_fill(~open_, float("-inf"))
    ranked = score.argsort(dim=1, descending=True, stable=True)[:, :width]
    tokens = proposal.tokens.gather(1, ranked)[..., None]
    if alternatives:
        others = slot_logits(proposal, ranked).scatter(-1, tokens, float("-inf")).topk(alternatives, dim=-1).indices
        tokens = torch.cat([tokens, others], -1)
    return ranked, open_.gather(1, ranked), tokens


def slot_logits(proposal: Proposal, ranked: torch.Tensor) -> torch.Tensor:
    """``[B, W, V]`` the step's logits at the region slots ``ranked [B, W]`` (a slot outside the window the logits
    cover reads the nearest edge: such a slot is never a usable candidate)."""
    at = (ranked - proposal.lo).clamp(0, proposal.logits.shape[1] - 1)
    return proposal.logits.gather(1, at[..., None].expand(-1, -1, proposal.logits.shape[-1]))


__all__ = ["SpiffyDrafts", "candidates", "slot_logits"]
