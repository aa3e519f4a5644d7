"""Delayed tree expansion (Thomas, Kitanovski, Goldblum, Pal 2026, "Dynamic Delayed Tree Expansion"): one sampled
trunk, then ``K`` i.i.d. rollouts branching from its end, drafted with a separate model."""

from __future__ import annotations

from typing import Any

from decodekit.checks import check_int
from decodekit.drafters.model_tree import ModelTreeDrafter
from decodekit.registry import register


@register("drafter", "delayed")
class DelayedTreeDrafter(ModelTreeDrafter):
    """A delayed tree ``(K, L1, L2)``: draft one path of ``L1`` tokens from the draft model, then ``K`` i.i.d.
    continuations of length ``L2`` from the trunk's last node.

    Node layout (parents first, siblings in draw order): trunk nodes ``0 .. L1 - 1`` form a chain, each trunk node
    with exactly **one** child (the trunk is not repeated per path, which would be a biased "multiplicity K" claim;
    ``shared/papers/verifiers.md`` §5.0); then one level per branch step, ``K`` nodes each, node ``k`` of a level
    the child of node ``k`` of the level before (the first branch level: ``K`` i.i.d. children of the trunk's end).
    Duplicates after the branch point are kept as separate nodes. Kind ``SAMPLED`` (``q`` one row per parent):
    every verifier that accepts i.i.d. children verifies it losslessly; on the trunk the multi-draft verifiers
    reduce to single-draft ones. ``L1 = 0`` is :class:`ModelTreeDrafter`'s ``"iid"`` shape, ``K = 1`` a chain of
    ``L1 + L2`` tokens. At temperature 0 the branch node gets its ``K`` most likely distinct children instead (a
    deterministic tree, as :class:`ModelTreeDrafter`).

    Budget: the trunk comes first, clipped to each row's ``depth`` and ``nodes``; the rest of the budget goes to
    the branches (``K`` capped by ``width`` and by the nodes left; ``L2`` by the depth and nodes left). Built on
    :class:`ModelTreeDrafter`'s rollout machinery (same cache handling, one forward per level, keyed draws).

    The paper's neural selector, an MLP that picks ``(K, L1, L2)`` per step from hidden states and p-vs-q
    statistics, is **not** implemented: ``(K, L1, L2)`` are fixed here (a length policy may still vary the budget).

    Args:
        model: the draft model (a :class:`~decodekit.models.LanguageModel`, a transformers causal LM or a path).
        branches: ``K``, the rollouts after the trunk.
        trunk: ``L1``, the tokens drafted before branching.
        branch_length: ``L2``, each rollout's length; None = as long as the budget allows.
        temperature: the drafter's temperature; None = the call's sampling parameters. 0 = deterministic trees.
    """

    def __init__(
        self,
        model: Any,
        branches: int = 2,
        trunk: int = 1,
        branch_length: int | None = None,
        temperature: float | None = None,
    ) -> None:
        self.trunk = check_int("trunk", trunk, low=0, hint=" (L1, the tokens before branching)")
        self.branch_length = check_int(
            "branch_length", branch_length, low=0, optional=True, hint=" (L2; None = the budget's)"
        )
        super().__init__(model, shape="iid", branches=branches, temperature=temperature)
