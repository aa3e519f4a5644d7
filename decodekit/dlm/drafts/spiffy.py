"""Spiffy-style auto-speculation: the diffusion LM's own proposals draft the canvases of the next steps."""

from __future__ import annotations

from itertools import combinations
from typing import Any

import torch

from decodekit.checks import check_int
from decodekit.dlm.state import DLMState, Proposal
from decodekit.errors import ConfigError
from decodekit.registry import register


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
    reproduced: the paper's pruning of unsure nodes during inference, and drafting alternative tokens for a slot
    (here: its proposed token only). In a batch each row walks its own graph: it steps on while its canvas is one
    of its drafts and waits for the next forward when not (with a rule that declares ``per_row_steps``; other rules
    keep the rows in step).

    Cost: a forward runs ``1 +`` (nodes) canvases (the block's slots only with the block-causal cache, whole
    canvases under recompute). It pays where a forward's time barely grows with its width (a GPU at small batch);
    on a CPU the forwards fall and the wall time rises.

    Args:
        width: candidate slots per row (the most confident masked ones); default 3.
        depth: the most candidates a drafted canvas commits (at most ``width``); default 3.
        graph: instead of every set up to ``depth``, the sets to draft, as lists of candidate ranks (0 = the most
            confident), such as :func:`~decodekit.dlm.drafts.calibrate.calibrate_graph` picks from recorded runs
            (Spiffy's offline calibration), or the name of a zoo model's calibrated graph (``CALIBRATED_GRAPHS``);
            ``width`` and ``depth`` then follow from it.
        budget: draft only the graph's first ``budget`` nodes (a calibration lists the most useful first; a forward
            runs ``1 + budget`` canvases); default all.
    """

    fixed_blocks = True  # drafts within state.block: every row in the same block

    def __init__(
        self, width: int | None = None, depth: int | None = None, graph: Any = None, budget: int | None = None
    ) -> None:
        if budget is not None and graph is None:
            raise ConfigError("budget takes the first nodes of a graph: pass graph=[...] or a calibrated graph's name")
        if graph is None:
            self.width = check_int("width", 3 if width is None else width, low=1)
            self.depth = check_int(
                "depth", 3 if depth is None else depth, low=1, high=self.width, hint=" (at most width)"
            )
            nodes = [c for k in range(1, self.depth + 1) for c in combinations(range(self.width), k)]
        elif width is not None or depth is not None:
            raise ConfigError("SpiffyDrafts takes a graph or width and depth, not both (a graph sets both)")
        else:
            nodes = check_graph(graph)
            if budget is not None:
                nodes = nodes[: check_int("budget", budget, low=1)]
            self.width, self.depth = max(max(n) for n in nodes) + 1, max(map(len, nodes))
        self.nodes: list[tuple[int, ...]] = sorted(nodes, key=lambda n: (len(n), n))

    def variants(self, state: DLMState, proposal: Proposal, committed: torch.Tensor, left: int) -> torch.Tensor | None:
        """``[1 + N, B, T]``: ``state.canvas``, then the ``N`` drafted canvases (None when no draft can help: a
        row's last step needs none). ``proposal`` and ``committed [B, G]``: the step just taken (unused: any rule's
        step count works); ``left``: the most masked slots a row has left in its block (a host int)."""
        depth = min(self.depth, left - 1)
        if depth < 1:
            return None
        ranked, usable = candidates(state, proposal, self.width)  # a row with fewer repeats a smaller set: harmless
        index = state.slots
        current = state.canvas.gather(1, index)  # [B, G]
        out = [state.canvas]
        for chosen in (n for n in self.nodes if len(n) <= depth):
            pick = torch.zeros_like(current, dtype=torch.bool).scatter(1, ranked[:, chosen], usable[:, chosen])
            out.append(state.canvas.scatter(1, index, torch.where(pick, proposal.tokens, current)))
        return torch.stack(out)


def candidates(state: DLMState, proposal: Proposal, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's ``width`` candidates after a step: ``[B, width]`` slot indices of the block's masked slots, most
    confident first by ``proposal``, and ``[B, width]`` bool, which of them are such slots (a row with fewer has
    ``False`` after its last)."""
    open_ = state.masked & state.in_block & proposal.predicted
    score = proposal.confidence.masked_fill(~open_, float("-inf"))
    ranked = score.argsort(dim=1, descending=True, stable=True)[:, :width]
    return ranked, open_.gather(1, ranked)


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


def check_graph(graph: Any) -> list[tuple[int, ...]]:
    """``graph`` (a list of sets, or the name of one in ``CALIBRATED_GRAPHS``) as sorted tuples of candidate ranks
    (0 = the most confident masked slot), each node once; a clear error for anything else."""
    if isinstance(graph, str):
        if graph not in CALIBRATED_GRAPHS:
            raise ConfigError(
                f"no calibrated graph named {graph!r}; the calibrated graphs: {sorted(CALIBRATED_GRAPHS)}"
            )
        graph = CALIBRATED_GRAPHS[graph]
    try:
        nodes = [tuple(sorted(int(r) for r in node)) for node in graph]
    except (TypeError, ValueError):
        raise ConfigError(
            f"graph must be a list of sets of candidate ranks, such as [[0], [0, 1], [1]]; got {graph!r}"
        ) from None
    for node in nodes:
        if not node or node[0] < 0 or len(set(node)) < len(node):
            raise ConfigError(f"each graph node is a non-empty set of distinct ranks >= 0; got {list(node)}")
    if not nodes or len(set(nodes)) < len(nodes):
        raise ConfigError(f"graph needs at least one node and each node once; got {graph!r}")
    return nodes


__all__ = ["CALIBRATED_GRAPHS", "SpiffyDrafts", "candidates", "check_graph"]
