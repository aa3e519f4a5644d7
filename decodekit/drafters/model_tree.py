"""A separate draft model drafts a token tree: i.i.d. or without-replacement rollouts, or an EAGLE-2 style dynamic
tree, grown level by level in the draft model's own KV cache.

Shapes: ``B`` rows, ``F`` parents expanded at a level, ``N`` draft nodes, ``T`` staged tree slots, ``V`` vocabulary.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

import torch

from decodekit.checks import check_choice, check_int
from decodekit.draft import Draft, DraftKind
from decodekit.draft.budget import DraftBudget
from decodekit.draft.templates import TreeTemplate, resolve_template
from decodekit.drafters.model import ModelDrafter
from decodekit.drafters.model_template import template_tree
from decodekit.drafters.staged import StagedTree, dynamic_tree, ignore_stop, process_paths
from decodekit.errors import ConfigError
from decodekit.registry import register
from decodekit.sampling import probs_from_logits, sample
from decodekit.spec.round import Round
from decodekit.spec.state import DecodeState
from decodekit.types import SamplingParams

SHAPES = ("iid", "without_replacement", "dynamic", "template")


@register("drafter", "model_tree")
class ModelTreeDrafter(ModelDrafter):
    """Draft a token tree with a separate causal LM (its own KV cache, as :class:`ModelDrafter`).

    Shapes (``shape=``):

    * ``"iid"``: ``branches = K`` independent rollouts of length ``L = min(depth, nodes // K)``: the pending token's
      ``K`` children are drawn i.i.d. from ``q(.|root)`` and each is continued by its own sampled chain; duplicate
      prefixes are not merged (each rollout keeps its nodes). Kind ``SAMPLED``; ``q`` one row per parent
      (``q_index``), the distribution each node was drawn from.
    * ``"without_replacement"``: the same, but the root's ``K`` children are drawn without replacement (successive
      sampling, listed in draw order; fewer when ``q`` has fewer than ``K`` tokens). Kind
      ``SAMPLED_WITHOUT_REPLACEMENT``; ``q`` is the root's distribution before any removal.
    * ``"dynamic"`` (EAGLE-2 / DySpec): each level expands the ``top_k`` frontier nodes with the highest cumulative
      draft probability (product along the path) into their ``top_k`` most likely children; the ``nodes`` best of
      all candidates (an ancestor-closed set: a child never outscores its parent) form the draft. Kind
      ``DETERMINISTIC`` (verified as point masses); the drafter's distributions go to ``Draft.draft_probs`` when a
      component needs ``"kl"``. Scores use the drafter's warped distribution (the plain softmax at temperature 0).
    * ``"template"`` (Medusa / EAGLE-1 static trees): a :class:`~decodekit.draft.templates.TreeTemplate` (or the name
      of one in ``decodekit.draft.templates.TEMPLATES``), node ``(r1, ..., rd)`` being the ``rd``-th most likely token
      after its parent's path under the same distribution; fitted to each round's budget as for every template drafter
      (:func:`~decodekit.drafters.model_template.template_tree`). Kind ``DETERMINISTIC``.

    At temperature 0 the i.i.d. rollouts would all be the same argmax chain, so the rollout shapes draft the ``K``
    most likely *distinct* children of the branch node instead, each continued by its argmax chain (a deterministic
    top-K tree: more useful than one chain, verified as point masses).

    Budget: ``width`` caps ``K`` (and ``top_k``); a row with fewer than ``K`` nodes drafts that many branches;
    nodes past a row's ``nodes`` / ``depth`` are invalid. Each level is drawn with one keyed
    :func:`~decodekit.sampling.sample` per level (per sibling for without-replacement draws), so per-row seeds stay
    per row; the call's logits processors see each node's exact path (:func:`~decodekit.spec.processors.process_next`).
    A policy's per-step stop rule (``budget.stop``) is for chains and is refused.

    Cache and cost per round: one forward commits the tokens the draft cache has not seen (as :class:`ModelDrafter`),
    then one staged tree-masked forward per level over all nodes the next level expands (``depth - 1`` forwards; the
    last level is never run). :meth:`observe` keeps the accepted path's staged K/V where it is known on the host that
    they were computed (every level but the last for rollouts, the first level of a dynamic tree) and crops the rest;
    the next round recomputes only what was not kept. No host syncs of its own (after rows leave the batch the draft
    cache reads its lengths once, as :class:`ModelDrafter`'s).

    Args:
        model: the draft model (a :class:`~decodekit.models.LanguageModel`, a transformers causal LM or a path).
        shape: ``"iid"``, ``"without_replacement"`` or ``"dynamic"``.
        branches: ``K``, the rollouts of the rollout shapes.
        temperature: the drafter's temperature; None = the call's sampling parameters. 0 = deterministic trees.
        top_k: ``"dynamic"`` only: children per expanded node and nodes expanded per level (None = 4).
        template: ``"template"`` only: a :class:`~decodekit.draft.templates.TreeTemplate` or a name in ``TEMPLATES``
            (None = ``"smollm2_16"``).
    """

    trunk: int = 0  # rollout shapes: single-child levels before the branch (DelayedTreeDrafter)
    branch_length: int | None = None  # rollout shapes: the most levels after the branch (None = the budget's)

    def __init__(
        self,
        model: Any,
        shape: str = "iid",
        branches: int = 2,
        temperature: float | None = None,
        top_k: int | None = None,
        template: TreeTemplate | str | None = None,
    ) -> None:
        self.shape = check_choice("shape", shape, SHAPES)
        self.branches = check_int("branches", branches, low=1, hint=" (the number of rollouts K)")
        self.top_k = check_int("top_k", top_k, low=1, optional=True, hint=" (children per expanded node)")
        if top_k is not None and shape != "dynamic":
            raise ConfigError(f"top_k is for shape='dynamic'; shape={shape!r} uses branches (got top_k={top_k})")
        if template is not None and shape != "template":
            raise ConfigError(f"template is for shape='template'; got shape={shape!r} (pass shape='template')")
        self.template = template
        self._template = resolve_template("smollm2_16" if template is None else template)
        super().__init__(model, temperature)
        if self.model.tree_refusal or not self.model.full_attention:
            why = self.model.tree_refusal or "it has sliding-window or chunked attention layers"
            raise ConfigError(f"{type(self).__name__} cannot draft trees with {self.model!r} ({why}); use ModelDrafter")
        self._staged: tuple[torch.Tensor, int] | None = None  # this round's node slots [B, N], levels kept

    def draft_kind(self, sampling: SamplingParams) -> DraftKind:
        if self.shape in ("dynamic", "template") or self.sampling(sampling).greedy:
            return DraftKind.DETERMINISTIC
        return DraftKind.SAMPLED_WITHOUT_REPLACEMENT if self.shape == "without_replacement" else DraftKind.SAMPLED

    @torch.no_grad()
    def propose(self, state: DecodeState, budget: DraftBudget) -> Draft:
        ignore_stop(budget, self)
        self._staged = None
        logits = self.feed_unseen(state)[:, None]  # [B, 1, V]
        if budget.max_len == 0 or budget.width == 0:
            return Draft.empty(state.batch_size, state.device)
        tree = StagedTree.of_model(self, state.batch_size, state.device)
        if self.shape == "dynamic":
            return self._dynamic(state, budget, tree, logits)
        if self.shape == "template":
            draft, self._staged = template_tree(self, state, budget, tree, logits, self._template)
            return draft
        return self._rollouts(state, budget, tree, logits)

    def observe(self, state: DecodeState, round: Round) -> None:
        """Keep the accepted path's staged K/V where they exist, then drop the rest (as :class:`ModelDrafter`)."""
        staged, self._staged = self._staged, None
        if staged is not None and staged[1] > 0:
            slots, levels = staged
            counts = [min(n - 1 - s, levels) for n, s in zip(state.host_lengths, self.cache.host_lengths())]
            if any(counts):  # path node j's K/V, at slot L_b + slots[node], move to L_b + j (j >= count: stays)
                kept = torch.tensor(counts, device=slots.device)
                ar = torch.arange(max(counts), device=slots.device).expand(len(counts), -1)
                nodes = slots.gather(1, round.verdict.accepted[:, : max(counts)].clamp(min=0))
                self.cache.keep(kept, torch.where(ar < kept[:, None], nodes, ar), host_counts=counts)
        super().observe(state, round)

    # ---------------------------------------------------------------------------------------------- rollouts
    def _rollouts(self, state: DecodeState, budget: DraftBudget, tree: StagedTree, logits: torch.Tensor) -> Draft:
        """``trunk`` single-child levels, then ``K`` rollouts branching from the trunk's end (or the root)."""
        sampling, vocab = self.sampling(state.sampling), logits.shape[-1]
        greedy, report = sampling.greedy, sampling.greedy and "kl" in state.needs
        k = min(self.branches, budget.width or self.branches, vocab)
        trunk = min(self.trunk, budget.max_depth, budget.max_nodes)
        room = budget.max_nodes - trunk
        branch = min(budget.max_depth - trunk, max(1, room // k) if room > 0 else 0)
        branch = branch if self.branch_length is None else min(branch, self.branch_length)
        levels = trunk + branch
        nodes, depth = budget.nodes, budget.depth_or_nodes
        row_trunk = torch.minimum(depth, nodes).clamp(min=0, max=self.trunk)
        row_k = (nodes - row_trunk).clamp(min=0, max=k)
        row_branch = torch.minimum(depth - row_trunk, (nodes - row_trunk) // row_k.clamp(min=1))
        row_branch = row_branch.clamp(max=self.branch_length) if self.branch_length is not None else row_branch
        batch, device = state.batch_size, state.device
        parent_nodes = torch.full((batch, 1), -1, dtype=torch.long, device=device)
        parent_slots, parent_valid = parent_nodes, torch.ones(batch, 1, dtype=torch.bool, device=device)
        paths = torch.zeros(batch, 1, 0, dtype=torch.long, device=device)
        tokens, parents, valid, q_index, qs = [], [], [], [], []
        n = rows = 0
        for d in range(1, levels + 1):
            fan = k if d == trunk + 1 else 1
            logits = process_paths(state, logits, paths)
            cols = torch.arange(logits.shape[1], device=device).repeat_interleave(fan)  # each child's parent column
            x, ok, probs = self._draw(logits, sampling, fan, state, key=("tree", d), report=report)
            if d <= trunk:
                ok = ok & (d <= row_trunk)[:, None]
            else:
                ok = (
                    ok & (d - trunk <= row_branch)[:, None] & (torch.arange(x.shape[1], device=device) < row_k[:, None])
                )
            ok = ok & parent_valid[:, cols]
            ids = torch.arange(n, n + x.shape[1], device=device).expand(batch, -1)
            tokens.append(x), parents.append(parent_nodes[:, cols]), valid.append(ok)
            q_index.append((rows + cols).expand(batch, -1))
            qs.append(probs)
            n, rows = n + x.shape[1], rows + logits.shape[1]
            if d < levels:
                logits, slots = tree.forward(x, parent_slots[:, cols])
                parent_nodes, parent_slots, parent_valid = ids, slots, ok
                paths = torch.cat([paths[:, cols], x[..., None]], 2)
        # nodes are staged in index order, level by level: node i of a level < `levels` sits at slot i
        self._staged = (torch.arange(n, device=device).expand(batch, n), levels - 1)
        tokens_t, parents_t, valid_t = torch.cat(tokens, 1), torch.cat(parents, 1), torch.cat(valid, 1)
        index = torch.cat(q_index, 1)
        width = budget.host_tree_width([t.shape[1] for t in tokens])  # a row's last node is within both bounds
        if greedy:
            probs = torch.cat(qs, 1).gather(1, index[..., None].expand(-1, -1, vocab)) if report else None
            draft = Draft.tree(tokens_t, parents_t, valid_t, kind=DraftKind.DETERMINISTIC, draft_probs=probs)
        else:
            kind = self.draft_kind(state.sampling)
            draft = Draft.tree(tokens_t, parents_t, valid_t, kind=kind, q=torch.cat(qs, 1), q_index=index)
        return draft.knowing_width(width, exact=False)

    def _draw(
        self, logits: torch.Tensor, sampling: SamplingParams, fan: int, state: DecodeState, key: Hashable, report: bool
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """Children of the ``F`` parents of ``logits [B, F, V]``: one each, or ``fan`` of the single parent.

        Returns tokens ``[B, F']``, whether each was really drawn ``[B, F']`` (False once a without-replacement
        draw or a top-K runs out of tokens), and the parents' distributions ``[B, F, V]`` (``q``; at temperature 0
        the softmax when ``report``, else None)."""
        if sampling.greedy:
            probs = logits.float().softmax(-1) if report else None
            if fan == 1:
                return logits.argmax(-1), torch.ones_like(logits[..., 0], dtype=torch.bool), probs
            top = logits[:, 0].topk(fan, -1)
            return top.indices, top.values > float("-inf"), probs
        probs = probs_from_logits(logits, sampling)
        if fan == 1:
            x = sample(probs, state.generator, key=key)
            return x, torch.ones_like(x, dtype=torch.bool), probs
        if self.shape != "without_replacement":
            x = sample(probs.expand(-1, fan, -1), state.generator, key=key)
            return x, torch.ones_like(x, dtype=torch.bool), probs
        left, xs, oks = probs[:, 0], [], []
        for j in range(fan):  # successive draws, each from what earlier siblings left
            x = sample(left, state.generator, key=(key, j))
            oks.append(left.gather(1, x[:, None])[:, 0] > 0)
            xs.append(x)
            left = left.scatter(1, x[:, None], 0.0)
        return torch.stack(xs, 1), torch.stack(oks, 1), probs

    # ----------------------------------------------------------------------------------------------- dynamic
    def _dynamic(self, state: DecodeState, budget: DraftBudget, tree: StagedTree, logits: torch.Tensor) -> Draft:
        """EAGLE-2's expand-then-rerank tree (:func:`~decodekit.drafters.staged.dynamic_tree`)."""
        sampling = self.sampling(state.sampling)
        draft, slots, levels = dynamic_tree(state, budget, sampling, self.top_k or 4, tree, logits)
        # every level-1 candidate is expanded (c <= top_k), so an accepted path's first node always has K/V
        self._staged = (slots, min(1, levels - 1))
        return draft
