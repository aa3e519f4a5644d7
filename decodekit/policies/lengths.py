"""Per-row lengths to a draft budget: the one conversion every adaptive policy uses, for chains and tree budgets."""

from __future__ import annotations

from collections.abc import Callable

import torch

from decodekit.budget import DraftBudget, DraftStep
from decodekit.checks import check_int


def check_tree_args(nodes_per_depth: int, width: int | None) -> tuple[int, int | None]:
    """Validated ``(nodes_per_depth, width)`` of an adaptive policy's tree budget."""
    nodes_per_depth = check_int(
        "nodes_per_depth", nodes_per_depth, low=1, hint=" (1 = chains; r > 1: a tree of r nodes per depth level)"
    )
    return nodes_per_depth, check_int("width", width, low=1, optional=True, hint=" (None = no cap)")


def length_budget(
    lengths: torch.Tensor,
    bound: int,
    nodes_per_depth: int = 1,
    width: int | None = None,
    stop: Callable[[DraftStep], torch.Tensor] | None = None,
) -> DraftBudget:
    """The budget for per-row lengths ``lengths [B]`` (long, within ``[0, bound]``; 0 = do not draft).

    Chains (``nodes_per_depth = 1``): row ``b`` drafts ``lengths[b]`` tokens. Trees: ``lengths[b]`` is the depth
    and the row gets ``nodes_per_depth * lengths[b]`` nodes (``width`` caps any node's children), so a policy that
    adapts a chain length adapts a tree's depth and size together. ``bound`` (host) spares drafters a sync.
    """
    if nodes_per_depth == 1:
        return DraftBudget(lengths, width=width, stop=stop, node_bound=bound)
    return DraftBudget(
        lengths * nodes_per_depth, lengths, width, stop, node_bound=bound * nodes_per_depth, depth_bound=bound
    )
