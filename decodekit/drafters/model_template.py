"""A draft model fills a static tree template: node ``(r1, ..., rd)`` is the ``rd``-th most likely token after its
parent's path (Medusa / EAGLE-1 style static trees, with a separate draft model instead of heads).

Shapes: ``B`` rows, ``N`` template nodes (after fitting the budget), ``M`` nodes of one depth, ``V`` vocabulary.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from decodekit.draft import Draft, DraftKind
from decodekit.draft.budget import DraftBudget
from decodekit.draft.templates import TreeTemplate, fit_template
from decodekit.drafters.staged import StagedTree, process_paths
from decodekit.sampling import probs_from_logits
from decodekit.spec.state import DecodeState

if TYPE_CHECKING:
    from decodekit.drafters.model_tree import ModelTreeDrafter


def template_tree(
    drafter: ModelTreeDrafter,
    state: DecodeState,
    budget: DraftBudget,
    tree: StagedTree,
    logits: torch.Tensor,
    template: TreeTemplate,
) -> tuple[Draft, tuple[torch.Tensor, int] | None]:
    """Fill ``template`` (fitted to ``budget``) from the draft model, one depth at a time.

    ``logits [B, 1, V]`` are the draft model's logits after the pending token. Every node of a depth but the last
    runs in one staged forward (leaves included, so the accepted path's K/V is known to exist for every staged
    depth); ranks are taken under the drafter's warped distribution after the call's logits processors (the plain
    softmax at temperature 0); a token that distribution excludes (probability 0) is not drafted, nor is anything
    under it. Returns the draft (kind ``DETERMINISTIC``; ``draft_probs`` when a component needs ``"kl"``) and the
    staged slots ``([B, N], depths kept)`` for :meth:`ModelTreeDrafter.observe` (None when nothing was drafted).
    """
    fitted = fit_template(template, budget, state.device)
    n, batch, device = fitted.tree.num_nodes, state.batch_size, state.device
    if n == 0:
        return Draft.empty(batch, device), None
    sampling, report = drafter.sampling(state.sampling), "kl" in state.needs
    fits = fitted.fits(budget)
    tokens, valid, rows = [], [], []
    paths = torch.zeros(batch, 1, 0, dtype=torch.long, device=device)
    slots = torch.full((batch, 1), -1, dtype=torch.long, device=device)  # the last forward's nodes (-1: the root)
    above = torch.ones(batch, 1, dtype=torch.bool, device=device)  # whether those nodes were drafted
    previous = 0  # index of the first node of the depth above
    for d, (start, end) in enumerate(fitted.levels):
        logits = process_paths(state, logits, paths)
        probs = logits.float().softmax(-1) if sampling.greedy else probs_from_logits(logits, sampling)
        cols = fitted.parents[start:end] - previous if d else torch.zeros(end - start, dtype=torch.long, device=device)
        deepest = max(c[-1] for c in fitted.tree.choices[start:end])
        top = probs.topk(min(deepest + 1, probs.shape[-1]), -1)  # [B, F, r]
        ranks = fitted.ranks[start:end]
        inside = ranks < top.indices.shape[-1]  # a rank past a tiny vocabulary drafts nothing
        ranks = torch.where(inside, ranks, 0)
        x = top.indices[:, cols, ranks]  # [B, M]
        ok = above[:, cols] & fits[:, start:end] & inside & (top.values[:, cols, ranks] > 0)
        tokens.append(x), valid.append(ok)
        if report:
            rows.append(probs[:, cols])
        if d + 1 < len(fitted.levels):
            logits, slots = tree.forward(x, slots[:, cols])
            paths = torch.cat([paths[:, cols], x[..., None]], 2)
            above, previous = ok, start
    parents = fitted.parents.expand(batch, n)
    draft = Draft.tree(
        torch.cat(tokens, 1),
        parents,
        torch.cat(valid, 1),
        kind=DraftKind.DETERMINISTIC,
        draft_probs=torch.cat(rows, 1) if report else None,
    ).knowing_width(fitted.host_width(budget), exact=False)
    # nodes are staged in index order, one depth after another, all but the last depth: node i sits at slot i
    return draft, (torch.arange(n, device=device).expand(batch, n), len(fitted.levels) - 1)
