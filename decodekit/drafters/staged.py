"""A drafter's token tree, staged level by level in its own KV cache (shared by the tree drafters built on
:class:`~decodekit.drafters.ModelDrafter` and by the EAGLE head), and EAGLE-2's dynamic tree grown on it.

Shapes: ``B`` rows, ``F`` parents expanded at a level, ``M`` nodes of a level, ``T`` staged tree slots, ``V``
vocabulary.
"""

from __future__ import annotations

import warnings
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from decodekit.cache import CacheView, KVCache
from decodekit.draft import Draft, DraftKind
from decodekit.draft.budget import DraftBudget
from decodekit.masks import tree_mask
from decodekit.sampling import probs_from_logits
from decodekit.spec.processors import process_next
from decodekit.spec.state import DecodeState
from decodekit.types import SamplingParams

if TYPE_CHECKING:
    from decodekit.drafters.model import ModelDrafter


Run = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, CacheView], torch.Tensor]
"""``run(tokens [B, M], parent_slots [B, M], positions [B, M], mask [B, 1, M, S], view) -> logits [B, M, V]``: one
staged forward of a tree level against the cache's ``view`` (a draft model's, or a feature head's that also reads
its parents' features)."""


class StagedTree:
    """One round's tree in a draft cache: node ``t`` of the staged block sits at slot ``L_b + t`` (``L_b`` = the
    cache's committed length) and attends to the committed prefix, its ancestors and itself.

    Args:
        cache: the drafter's :class:`~decodekit.cache.KVCache`.
        run: the staged forward of one level (:data:`Run`).
    """

    def __init__(self, cache: KVCache, run: Run, batch: int, device: torch.device) -> None:
        self.cache, self.run = cache, run
        self.ancestors = torch.zeros(batch, 0, 0, dtype=torch.bool, device=device)  # [B, T, T] over staged slots

    @classmethod
    def of_model(cls, drafter: ModelDrafter, batch: int, device: torch.device) -> StagedTree:
        """The tree of a draft model (:class:`~decodekit.drafters.ModelDrafter`) in its own cache."""

        def run(tokens: torch.Tensor, parents: Any, positions: torch.Tensor, mask: torch.Tensor, view: Any) -> Any:
            return drafter.model.forward(tokens, positions, mask, view).logits

        return cls(drafter.cache, run, batch, device)

    def forward(self, tokens: torch.Tensor, parent_slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Stage ``tokens [B, M]`` (one tree level) under the nodes at ``parent_slots [B, M]`` (-1 = the root: the
        pending token) and run them in one forward. Returns their logits ``[B, M, V]`` and slots ``[B, M]``."""
        off, (batch, m) = self.ancestors.shape[1], tokens.shape
        anc = torch.zeros(batch, off + m, off + m, dtype=torch.bool, device=tokens.device)
        anc[:, :off, :off] = self.ancestors
        if off:
            rows = self.ancestors.gather(1, parent_slots.clamp(min=0)[..., None].expand(-1, -1, off))
            anc[:, off:, :off] = rows & (parent_slots >= 0)[..., None]
        anc[:, off:, off:] = torch.eye(m, dtype=torch.bool, device=tokens.device)
        view = self.cache.stage(m, offset=off)
        mask, positions = tree_mask(self.cache.lengths, anc, view.kv_len)
        logits = self.run(tokens, parent_slots, positions[:, off:], mask[:, :, off:], view)
        self.ancestors = anc
        slots = torch.arange(off, off + m, device=tokens.device).expand(batch, m)
        return logits, slots


def process_paths(state: DecodeState, logits: torch.Tensor, paths: torch.Tensor) -> torch.Tensor:
    """The call's logits processors on ``logits [B, F, V]`` after each parent's path ``paths [B, F, d]``."""
    if state.processing is None:
        return logits
    drafted = [paths[:, f] if paths.shape[2] else None for f in range(logits.shape[1])]
    return torch.stack([process_next(state, logits[:, f], drafted[f]) for f in range(logits.shape[1])], 1)


def dynamic_tree(
    state: DecodeState,
    budget: DraftBudget,
    sampling: SamplingParams,
    top_k: int,
    tree: StagedTree,
    logits: torch.Tensor,
) -> tuple[Draft, torch.Tensor, int]:
    """EAGLE-2's expand-then-rerank tree (Li et al. 2024; DySpec): each level expands the ``top_k`` frontier nodes
    with the highest cumulative draft probability into their ``top_k`` most likely children; the ``nodes`` best of
    all candidates (ancestor-closed: a child never outscores its parent) form the draft, numbered level by level so
    parents come first.

    Args:
        sampling: the drafter's sampling parameters (scores use its warped distribution; plain softmax at 0).
        top_k: children per expanded node and nodes expanded per level (``budget.width`` caps the children).
        tree: the staged tree whose :meth:`StagedTree.forward` runs each expanded level.
        logits: ``[B, 1, V]`` the drafter's logits after the root (the pending token).

    Returns:
        The deterministic draft (``draft_probs`` when a component needs ``"kl"``), ``[B, N]`` each node's staged
        slot (-1 where never run: the last level) and the number of levels.
    """
    report, vocab = "kl" in state.needs, logits.shape[-1]
    c = min(top_k, budget.width or top_k, vocab)
    levels = min(budget.max_depth, budget.max_nodes)
    batch, device = state.batch_size, state.device
    f_idx = torch.full((batch, 1), -1, dtype=torch.long, device=device)
    f_score, f_slot = torch.zeros(batch, 1, device=device), f_idx
    paths = torch.zeros(batch, 1, 0, dtype=torch.long, device=device)
    tokens, parents, scores, slots, prow, rows, offered = [], [], [], [], [], [], []
    n = 0
    for d in range(1, levels + 1):
        logits = process_paths(state, logits, paths)
        conf = logits.float().softmax(-1) if sampling.greedy else probs_from_logits(logits, sampling)
        top = conf.topk(c, -1)  # [B, F, c]
        f = logits.shape[1]
        score = f_score[..., None] + top.values.log().clamp(max=0)
        score = score.masked_fill((d > budget.depth_or_nodes)[:, None, None], float("-inf")).flatten(1)
        tok = top.indices.flatten(1)
        tokens.append(tok), parents.append(f_idx.repeat_interleave(c, 1)), scores.append(score)
        if report:
            prow.append(sum(r.shape[1] for r in rows) + torch.arange(f, device=device).repeat_interleave(c))
            rows.append(conf)
        level_slots = torch.full_like(tok, -1)
        if d < levels:
            best = score.topk(min(top_k, f * c), -1)
            sel = best.indices
            f_tok = tok.gather(1, sel)
            logits, f_slot = tree.forward(f_tok, f_slot.gather(1, sel // c))
            level_slots.scatter_(1, sel, f_slot)
            f_idx, f_score = n + sel, best.values
            paths = torch.cat([paths.gather(1, (sel // c)[..., None].expand(-1, -1, d - 1)), f_tok[..., None]], 2)
        slots.append(level_slots)
        n += f * c
        offered.append(f * c)
    score, ar = torch.cat(scores, 1), torch.arange(n, device=device)
    order = torch.sort(score, dim=-1, descending=True, stable=True).indices  # ties: parents (lower index) first
    rank = torch.empty_like(order).scatter_(1, order, ar.expand(batch, n))
    keep = (rank < budget.nodes[:, None]) & (score > float("-inf"))
    width = min(budget.max_nodes, n)
    pick = torch.sort(torch.where(keep, ar, n + ar), -1).indices[:, :width]  # kept candidates, in index order
    valid = keep.gather(1, pick)
    new = torch.full_like(order, -1).scatter_(1, pick, torch.arange(width, device=device).expand(batch, -1))
    parent = torch.cat(parents, 1).gather(1, pick)
    parent = torch.where(valid & (parent >= 0), new.gather(1, parent.clamp(min=0)), -1)
    probs = None
    if report:
        index = torch.cat(prow).expand(batch, -1).gather(1, pick)
        probs = torch.cat(rows, 1).gather(1, index[..., None].expand(-1, -1, vocab))
    tokens_t = torch.cat(tokens, 1).gather(1, pick)
    draft = Draft.tree(tokens_t, parent, valid, kind=DraftKind.DETERMINISTIC, draft_probs=probs)
    draft.knowing_width(budget.host_tree_width(offered), exact=False)  # the candidates, level by level
    return draft, torch.cat(slots, 1).gather(1, pick), levels


_STOP_IGNORED: weakref.WeakSet = weakref.WeakSet()  # tree drafters that said their budget's stop rule does not apply


def ignore_stop(budget: DraftBudget, drafter: object) -> None:
    """A tree drafter's answer to a budget with a per-step stop rule: trees are drafted level by level, so the rule
    does not apply and the drafts are bounded by the budget's lengths alone (as for a model-free drafter); said once
    per drafter in a warning, not refused in the middle of a call."""
    if budget.stop is not None and drafter not in _STOP_IGNORED:
        _STOP_IGNORED.add(drafter)
        warnings.warn(
            f"{type(drafter).__name__} drafts trees level by level: the policy's per-step stop rule does not apply, "
            "its drafts are bounded by the budget's lengths only (use a chain drafter for the rule to act)",
            stacklevel=3,
        )
