"""Spiffy draft graphs: the nodes (sets of candidate ranks, each with a token choice), the graphs calibrated for the
zoo DLMs, and the index tensors that build and score a graph's canvases on a device."""

from __future__ import annotations

from typing import Any

import torch

from decodekit.checks import is_int
from decodekit.dlm.state import DLMState
from decodekit.errors import ConfigError

Node = tuple[tuple[int, int], ...]  # a drafted set: (candidate rank, token choice) pairs, token 0 the proposed one


class DraftGraph:
    """A draft graph's ``N`` nodes (sorted by size) as padded index tensors.

    Attributes:
        ranks, picks: ``[N, D]`` each element's candidate rank and token choice (padding repeats the first element).
        valid: ``[N, D]`` bool, the real elements; ``sizes [N]`` their count.
        The nodes a step can use (by size and candidate ranks) come from :meth:`fitting`.
        levels: per size, ``slice`` of the nodes of that size.
        children: per size, ``[n, C]`` the indices of each node's children (its set plus one element), padded with
            ``N`` (a sentinel column of scores ``-1`` is appended where read).
    """

    def __init__(self, nodes: list[Node], device: torch.device) -> None:
        n, d = len(nodes), max(map(len, nodes))
        padded = [list(node) + [node[0]] * (d - len(node)) for node in nodes]
        self.ranks = torch.tensor([[r for r, _ in row] for row in padded], device=device)
        self.picks = torch.tensor([[j for _, j in row] for row in padded], device=device)
        self.valid = torch.tensor([[i < len(node) for i in range(d)] for node in nodes], device=device)
        self.sizes = self.valid.sum(1)
        self._shape = [(len(node), max(r for r, _ in node)) for node in nodes]  # host: each node's size, top rank
        self._fitting: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}
        self.levels: list[slice] = []
        self.children: list[torch.Tensor] = []
        for size in range(1, d + 1):
            members = [i for i, node in enumerate(nodes) if len(node) == size]
            if not members:
                continue
            self.levels.append(slice(members[0], members[-1] + 1))
            kids = [[j for j, o in enumerate(nodes) if len(o) == size + 1 and set(nodes[i]) < set(o)] for i in members]
            width = max(1, *map(len, kids))
            self.children.append(torch.tensor([k + [n] * (width - len(k)) for k in kids], device=device))

    def fitting(self, depth: int, left: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The nodes a step can use when rows have at most ``left`` masked slots in the block and a canvas may
        commit ``depth`` of them: ``[N']`` their indices and ``[N]`` bool, those with at most ``depth`` elements
        whose ranks are all below ``left`` (any other names a candidate no row has, so drafts what a smaller set
        does). Built on the host once per ``(depth, left)``: no device read."""
        key = (depth, left)
        if key not in self._fitting:
            fits = [size <= depth and top < left for size, top in self._shape]
            mask = torch.tensor(fits, device=self.ranks.device)
            self._fitting[key] = (torch.tensor([i for i, f in enumerate(fits) if f], device=mask.device), mask)
        return self._fitting[key]

    def canvases(
        self, state: DLMState, ranked: torch.Tensor, usable: torch.Tensor, tokens: torch.Tensor, chosen: torch.Tensor
    ) -> torch.Tensor:
        """``[K, B, T]`` row ``b``'s canvas with node ``chosen[b, k]`` committed: each element's candidate slot
        (``ranked [B, W]``) with its token (``tokens [B, W, J]``), where ``usable [B, W]``."""
        rows = torch.arange(chosen.shape[0], device=chosen.device)[:, None, None]
        ranks, picks = self.ranks[chosen], self.picks[chosen]  # [B, K, D]
        slots = ranked[rows, ranks]  # [B, K, D]: region slots
        current = state.canvas.gather(1, state.slots)  # [B, G]
        kept = current[rows, slots]
        values = torch.where(usable[rows, ranks], tokens[rows, ranks, picks], kept)  # padding: the first element
        region = current[:, None].expand(-1, chosen.shape[1], -1).scatter(2, slots, values)  # [B, K, G]
        canvas = state.canvas[:, None].expand(-1, chosen.shape[1], -1)
        index = state.slots[:, None].expand(-1, chosen.shape[1], -1)
        return canvas.scatter(2, index, region).transpose(0, 1)


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


__all__ = ["CALIBRATED_GRAPHS", "DraftGraph", "Node", "check_graph"]
