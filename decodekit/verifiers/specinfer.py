"""SpecInfer's multi-step speculative sampling (Miao et al., ASPLOS 2024): recursive rejection sampling over a tree."""

from __future__ import annotations

import torch

from decodekit.registry import register
from decodekit.sampling import Generator
from decodekit.types import Draft, DraftKind, SamplingParams, Verdict
from decodekit.verifiers.tree import (
    TINY,
    WalkPlan,
    draw_laws,
    earlier_siblings,
    likelihood_ratio,
    parent_rows,
    tree_probs,
    walk,
)


def rrs_plan(draft: Draft, p: torch.Tensor, laws: torch.Tensor) -> WalkPlan:
    """Recursive rejection sampling's plan.

    At each node the current target ``p'`` starts as ``p``; its children are tried in draw order, child ``x`` with
    law ``q`` (:func:`~decodekit.verifiers.tree.draw_laws`) accepted with ``min(1, p'(x) / q(x))``; a rejection
    replaces ``p'`` by ``norm(max(p' - q, 0))``; after the last child the residual is ``p'``.

    Args:
        draft: ``N`` nodes per row.
        p: ``[B, N + 1, V]`` the target's distributions (row 0 = after the pending token).
        laws: ``[B, N, V]`` the law each node was drawn from given its earlier siblings.

    Work: each node's ``[V]`` row once, the nodes of one sibling rank at a time (all first children, then all
    second children, ...). Host syncs: one (how many nodes hold each rank).
    """
    batch, n = draft.tokens.shape
    vocab = p.shape[-1]
    valid = draft.valid.reshape(-1)
    tokens = draft.tokens.where(draft.valid, 0).reshape(-1)
    rank = earlier_siblings(draft).sum(-1).reshape(-1)
    rows = (parent_rows(draft) + torch.arange(batch, device=p.device)[:, None] * (n + 1)).reshape(-1)  # flat rows
    laws = laws.reshape(-1, vocab)
    residual = p.reshape(-1, vocab).clone()  # [B (N + 1), V]: each node's current p'
    accept = torch.zeros(batch * n, dtype=p.dtype, device=p.device)
    counts = torch.bincount(rank[valid], minlength=1).tolist()  # the one host sync
    for r, count in enumerate(counts):
        nodes = torch.nonzero_static(valid & (rank == r), size=count)[:, 0]  # at most one per parent
        parent = rows[nodes]
        current, law, x = residual[parent], laws[nodes], tokens[nodes]  # [M, V], [M, V], [M]
        q_x, p_x = law.gather(1, x[:, None])[:, 0], current.gather(1, x[:, None])[:, 0]
        accept[nodes] = likelihood_ratio(p_x, q_x).clamp(max=1)
        rest = (current - law).clamp_(min=0)
        mass = rest.sum(-1, keepdim=True)
        residual[parent] = torch.where(mass > 0, rest / mass.clamp(min=TINY), current)  # mass 0: accepted surely
    return WalkPlan(accept=accept.reshape(batch, n), residual=residual.reshape(batch, n + 1, vocab))


@register("verifier", "specinfer")
class SpecInferVerifier:
    """Lossless tree verification by recursive rejection sampling (SpecInfer's multi-step speculative sampling;
    Miao et al., ASPLOS 2024), with and without replacement.

    From the root, each node's children are tried in draw order against the node's current target ``p'``: child
    ``x`` is accepted with probability ``min(1, p'(x) / q(x))``; after a rejection ``p' <- norm(max(p' - q, 0))``;
    the walk moves into the first accepted child, and where every child is rejected the next token is drawn from
    ``p'`` (a leaf's ``p'`` is the target: the bonus). ``q`` is the law the child was drawn from given its earlier
    siblings, so one rule covers the three drafting processes: i.i.d. siblings keep the parent's ``q`` (duplicates
    allowed: a rejected token has ``p' = 0`` and is rejected again), siblings drawn without replacement use ``q``
    with the earlier siblings removed (RRSw, EAGLE-1's sampling mode), and deterministic trees are point masses
    (EAGLE-2's rule: accept ``x`` with ``p'(x)``, then remove it from ``p'``). On a chain it is token-wise
    :class:`~decodekit.verifiers.RejectionVerifier`. Checked by exact enumeration
    (``tests/unit/test_tree_verifiers.py``).

    Children are tried in the order listed (SpecInfer picks a uniformly random remaining child instead; both are
    lossless since draw order is independent of the values). Cost: one ``[B, N, V]`` pass per sibling rank and one
    host sync per round.
    """

    accepts = frozenset(DraftKind)
    lossless = True

    def verify(self, draft: Draft, logits: torch.Tensor, sampling: SamplingParams, generator: Generator) -> Verdict:
        p, empty = tree_probs(draft, logits, sampling, generator)
        if empty is not None:
            return empty
        return walk(draft, rrs_plan(draft, p, draw_laws(draft, p)), generator)
