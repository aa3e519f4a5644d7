"""SpecInfer's multi-step speculative sampling (Miao et al., ASPLOS 2024): recursive rejection sampling over a tree."""

from __future__ import annotations

import torch

from decodekit.registry import register
from decodekit.sampling import Generator
from decodekit.types import Draft, DraftKind, SamplingParams, Verdict
from decodekit.verifiers.tree import TINY, WalkPlan, draw_laws, earlier_siblings, parent_rows, tree_probs, walk


def rrs_plan(draft: Draft, p: torch.Tensor, laws: torch.Tensor) -> WalkPlan:
    """Recursive rejection sampling's plan.

    At each node the current target ``p'`` starts as ``p``; its children are tried in draw order, child ``x`` with
    law ``q`` (:func:`~decodekit.verifiers.tree.draw_laws`) accepted with ``min(1, p'(x) / q(x))``; a rejection
    replaces ``p'`` by ``norm(max(p' - q, 0))``; after the last child the residual is ``p'``.

    Args:
        draft: ``N`` nodes per row.
        p: ``[B, N + 1, V]`` the target's distributions (row 0 = after the pending token).
        laws: ``[B, N, V]`` the law each node was drawn from given its earlier siblings.

    Host syncs: one (the widest sibling rank, to bound the loop over ranks).
    """
    batch, n = draft.tokens.shape
    valid = draft.valid
    tokens = draft.tokens.where(valid, 0)
    rank = earlier_siblings(draft).sum(-1)
    rows = parent_rows(draft)
    q_x = laws.gather(-1, tokens[..., None])[..., 0]
    residual = torch.cat([p, torch.zeros_like(p[:, :1])], 1)  # a scratch row n + 1 takes writes of other ranks
    accept = torch.zeros_like(q_x)
    vocab = p.shape[-1]
    for r in range(int(rank.where(valid, 0).max()) + 1):
        chosen = valid & (rank == r)  # at most one node per parent
        current = residual.gather(1, rows[..., None].expand(-1, -1, vocab))  # [B, N, V] each parent's p'
        p_x = current.gather(-1, tokens[..., None])[..., 0]
        ratio = torch.where(q_x > 0, p_x / q_x.clamp(min=TINY), torch.zeros_like(p_x)).clamp(max=1)
        accept = torch.where(chosen, ratio, accept)
        rest = (current - laws).clamp(min=0)
        mass = rest.sum(-1, keepdim=True)
        after = torch.where(mass > 0, rest / mass.clamp(min=TINY), current)  # mass 0: accepted surely, unused
        target = torch.where(chosen, rows, n + 1)
        residual.scatter_(1, target[..., None].expand(-1, -1, vocab), after)
    return WalkPlan(accept=accept, residual=residual[:, : n + 1])


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
