"""Spiffy-style auto-speculation: the diffusion LM's own proposals draft the canvases of the next steps."""

from __future__ import annotations

from itertools import combinations, product
from typing import Any

import torch

from decodekit.checks import check_int, is_int
from decodekit.dlm.state import DLMState, Proposal
from decodekit.errors import ConfigError
from decodekit.registry import register

Node = tuple[tuple[int, int], ...]  # a drafted set: (candidate rank, token choice) pairs, token 0 the proposed one


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
    (:func:`~decodekit.dlm.drafts.calibrate.calibrate_graph`: a greedy pick over the sampler's recorded walks). Not
    reproduced: the paper's pruning of unsure nodes during inference. A graph may also draft a candidate with one of
    its other likely tokens by the step's logits (an element ``[r, j]``; not claimed to be the paper's choice of
    alternatives): on the zoo DLM most walks that stop do so because the next steps commit a candidate with another
    token than the one proposed now (docs/benchmarks.md). In a batch each row walks its own graph: it steps on while
    its canvas is one of its drafts and waits for the next forward when not (with a rule that declares
    ``per_row_steps``; other rules keep the rows in step).

    Cost: a forward runs ``1 +`` (nodes) canvases (the block's slots only with the block-causal cache, whole
    canvases under recompute). It pays where a forward's time barely grows with its width (a GPU at small batch);
    on a CPU the forwards fall and the wall time rises.

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
    """

    fixed_blocks = True  # drafts within state.block: every row in the same block

    def __init__(
        self,
        width: int | None = None,
        depth: int | None = None,
        graph: Any = None,
        budget: int | None = None,
        alternatives: int | None = None,
    ) -> None:
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

    def variants(self, state: DLMState, proposal: Proposal, committed: torch.Tensor, left: int) -> torch.Tensor | None:
        """``[1 + N, B, T]``: ``state.canvas``, then the ``N`` drafted canvases (None when no draft can help: a
        row's last step needs none). ``proposal`` and ``committed [B, G]``: the step just taken (unused: any rule's
        step count works); ``left``: the most masked slots a row has left in its block (a host int)."""
        depth = min(self.depth, left - 1)
        if depth < 1:
            return None
        # a row with fewer candidates keeps its unusable ones masked, so repeats a smaller set: harmless
        ranked, usable, tokens = candidates(state, proposal, self.width, self.alternatives)
        index = state.slots
        current = state.canvas.gather(1, index)  # [B, G]
        out = [state.canvas]
        for node in (n for n in self.nodes if len(n) <= depth):
            ranks, picks = [r for r, _ in node], [j for _, j in node]
            slots = ranked[:, ranks]  # [B, n]
            values = torch.where(usable[:, ranks], tokens[:, ranks, picks], current.gather(1, slots))
            out.append(state.canvas.scatter(1, index, current.scatter(1, slots, values)))
        return torch.stack(out)


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
        at = (ranked - proposal.lo).clamp(0, proposal.logits.shape[1] - 1)  # outside the window: not usable anyway
        logits = proposal.logits.gather(1, at[..., None].expand(-1, -1, proposal.logits.shape[-1]))
        others = logits.scatter(-1, tokens, float("-inf")).topk(alternatives, dim=-1).indices
        tokens = torch.cat([tokens, others], -1)
    return ranked, open_.gather(1, ranked), tokens


# Calibrated graphs, the most useful node first: ``dk.dlm.calibrate_graph(dlm, prompts, budget=31, width=8, depth=5,
# gen_length=128, block_length=32, steps=128, rule=..., cache=dk.dlm.BlockCausalCache(), seed=[0] * 8)`` on 8 stdlib
# code prompts (``load_task("stdlib", num_prompts=8, max_prompt_tokens=384, seed=1)``; never the benchmark's), with
# LLaDA's rule (1,024 recorded steps; replayed: 1.53x / 2.25x / 2.55x / 2.74x fewer forwards with the first 1 / 7 /
# 15 / 31 nodes) and with ``ThresholdRule(0.95)`` (657 steps; 1.26x / 1.63x / 1.74x / 1.82x fewer than its own).
CALIBRATED_GRAPHS: dict[str, list[list[int]]] = {
    "smollm2-135m-bdlm": [
        [0], [0, 1], [1], [0, 2], [0, 1, 2], [2], [1, 2], [0, 3], [0, 2, 3], [0, 1, 3], [0, 1, 2, 3], [0, 1, 4],
        [0, 1, 2, 4], [0, 4], [3], [2, 4], [4], [1, 3], [1, 4], [1, 2, 5], [0, 1, 2, 5], [0, 2, 3, 4], [5], [6], [7],
        [0, 5], [0, 1, 5], [0, 1, 2, 3, 4], [0, 1, 3, 5], [2, 3], [0, 1, 7],
    ],
    "smollm2-135m-bdlm-threshold-0.95": [
        [0], [0, 1], [1], [0, 2], [2], [0, 1, 2], [1, 2], [0, 4], [0, 1, 3], [0, 3], [0, 2, 3], [3], [4], [7],
        [1, 2, 5], [0, 1, 2, 3], [0, 2, 3, 4], [5], [6], [0, 7], [2, 3], [0, 2, 4], [0, 2, 5], [0, 4, 6], [1, 2, 3],
        [1, 3], [1, 2, 6], [2, 3, 4], [0, 1, 2, 4], [0, 1, 2, 5], [0, 1, 3, 5],
    ],
}  # fmt: skip


def check_graph(graph: Any) -> list[Node]:
    """``graph`` (a list of sets, or the name of one in ``CALIBRATED_GRAPHS``) as sorted tuples of ``(rank,
    token)`` pairs (rank 0: the most confident masked slot; token 0: its proposed one, ``j``: its ``j``-th most
    likely other; an element ``r`` is ``(r, 0)``), each node once; a clear error for anything else."""
    if isinstance(graph, str):
        if graph not in CALIBRATED_GRAPHS:
            raise ConfigError(
                f"no calibrated graph named {graph!r}; the calibrated graphs: {sorted(CALIBRATED_GRAPHS)}"
            )
        graph = CALIBRATED_GRAPHS[graph]
    try:
        nodes = [tuple(sorted(_element(e) for e in node)) for node in graph]
    except (TypeError, ValueError):
        raise ConfigError(
            "graph must be a list of sets of candidate ranks, each an int r or a pair [r, j] (rank r's j-th other "
            f"token), such as [[0], [0, 1], [1], [[0, 1]]]; got {graph!r}"
        ) from None
    for node in nodes:
        ranks = [r for r, _ in node]
        if not node or min(ranks) < 0 or min(j for _, j in node) < 0 or len(set(ranks)) < len(ranks):
            raise ConfigError(
                f"each graph node is a non-empty set of distinct ranks >= 0 (pairs [r, j]: j >= 0); got {list(node)}"
            )
    if not nodes or len(set(nodes)) < len(nodes):
        raise ConfigError(f"graph needs at least one node and each node once; got {graph!r}")
    return nodes


def _element(element: Any) -> tuple[int, int]:
    """A graph element as ``(rank, token)``: ``r`` -> ``(r, 0)``, ``[r, j]`` -> ``(r, j)``."""
    if is_int(element):
        return int(element), 0
    rank, token = element
    if not (is_int(rank) and is_int(token)):
        raise TypeError(element)
    return int(rank), int(token)


__all__ = ["CALIBRATED_GRAPHS", "Node", "SpiffyDrafts", "candidates", "check_graph"]
