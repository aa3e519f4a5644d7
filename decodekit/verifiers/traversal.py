"""Traversal verification (Weng, Hu, Chen, Liu, Mei, Qiu, Tian, Shi; NeurIPS 2025, arXiv 2505.12398)."""

from __future__ import annotations

import torch

from decodekit.registry import register
from decodekit.sampling import Generator
from decodekit.types import Draft, DraftKind, SamplingParams, Verdict
from decodekit.verifiers.block import BlockVerifier
from decodekit.verifiers.tree import (
    TINY,
    SequencePlan,
    draw_laws,
    earlier_siblings,
    likelihood_ratio,
    parent_rows,
    token_probs,
    tree_probs,
    visit,
)


def post_order(draft: Draft) -> torch.Tensor:
    """``[B, N]`` the valid nodes in post-order (children before parents, earlier-drawn siblings first), then ``-1``.

    A node's post-order rank is its subtree size minus one plus, for it and each ancestor, the sizes of the
    subtrees of its earlier siblings: no loop over the tree."""
    anc = draft.ancestors.float()  # [b, i, a]: a is i or an ancestor of i
    size = anc.sum(1)  # [B, N] subtree sizes (valid nodes)
    left = (earlier_siblings(draft).float() @ size[..., None])[..., 0]  # sizes of the earlier siblings' subtrees
    rank = size - 1 + (anc @ left[..., None])[..., 0]
    rank = torch.where(draft.valid, rank, float(draft.num_nodes) + 1)
    order = rank.argsort(-1)
    ar = torch.arange(draft.num_nodes, device=order.device)
    return torch.where(ar < draft.num_valid[:, None], order, -1)


def traversal_plan(draft: Draft, p: torch.Tensor, laws: torch.Tensor) -> SequencePlan:
    """Traversal verification's plan: the visit order is fixed (post-order, then the root), so the acceptance
    probability of each visit and the law of the token it emits follow from the rejections before it.

    Each node keeps ``α`` (the probability that the walk accepts within its subtree given its prefix was drafted),
    a current target row ``P`` (initially ``p``) and its law ``q`` (:func:`~decodekit.verifiers.tree.draw_laws`).
    Top-down, ``α_c = min(1, α_u P_u(x_c) / q_c(x_c))`` (``α_root = 1``). Visiting leaf ``v`` with parent ``u``:
    accept with ``α_v`` (emit ``P_v``); otherwise delete ``v``, and with ``m = Σ max(α_u P_u - q_v, 0)`` set
    ``P_u <- norm(max(α_u P_u - q_v, 0))``, ``α_u <- m / (m + 1 - α_u)`` (``0`` if ``m = 0``), then refresh the
    ``α`` of ``u``'s remaining descendants. The root, visited last, always accepts and emits ``P_root``.

    Args:
        draft: ``N`` nodes per row.
        p: ``[B, N + 1, V]`` the target's distributions (row 0 = after the pending token).
        laws: ``[B, N, V]`` the law each node was drawn from given its earlier siblings.

    Cost: ``N`` sequential steps, each one ``[B, V]`` residual and a refresh of ``α`` over the depth levels.
    Host syncs: one (the deepest node, to bound the refresh).
    """
    batch, n = draft.tokens.shape
    valid = draft.valid
    tokens = draft.tokens.where(valid, 0)
    rows = parent_rows(draft)
    depth = draft.depth
    max_depth = int(depth.max())
    q_x = laws.gather(-1, tokens[..., None])[..., 0]
    target = p.clone()  # P, row 0 = the root
    ratio = likelihood_ratio(token_probs(p, rows, tokens), q_x)
    alpha = torch.ones(batch, n + 1, dtype=p.dtype, device=p.device)
    fixed = torch.zeros(batch, n + 1, dtype=torch.bool, device=p.device)
    fixed[:, 0] = True  # the root's α is never derived from a parent

    def refresh() -> None:
        for d in range(1, max_depth + 1):
            derived = (alpha.gather(1, rows) * ratio).clamp(max=1)
            alpha[:, 1:] = torch.where((depth == d) & ~fixed[:, 1:], derived, alpha[:, 1:])

    refresh()
    order = post_order(draft)
    out_alpha = torch.zeros(batch, n + 1, dtype=p.dtype, device=p.device)
    emission = torch.empty_like(p)
    b = torch.arange(batch, device=p.device)
    for j in range(n):
        v = order[:, j].clamp(min=0)
        live = order[:, j] >= 0
        out_alpha[:, j] = torch.where(live, alpha[b, v + 1], 0)
        emission[:, j] = target[b, v + 1]
        u = rows[b, v]  # the parent's row
        a_u, p_u = alpha[b, u], target[b, u]
        rest = (a_u[:, None] * p_u - laws[b, v]).clamp(min=0)
        m = rest.sum(-1)
        new_p = torch.where((live & (m > 0))[:, None], rest / m.clamp(min=TINY)[:, None], p_u)
        new_a = torch.where(m > 0, m / (m + 1 - a_u).clamp(min=TINY), torch.zeros_like(m))
        target[b, u] = new_p
        alpha[b, u] = torch.where(live, new_a, a_u)
        fixed[b, u] |= live
        children = (rows == u[:, None]) & valid & live[:, None]
        child_p = new_p.gather(1, tokens)
        ratio = torch.where(children, likelihood_ratio(child_p, q_x), ratio)
        refresh()
    out_alpha[:, n] = 1
    emission[:, n] = target[:, 0]
    order = torch.cat([order, torch.full_like(order[:, :1], -1)], 1)
    return SequencePlan(order=order, alpha=out_alpha, emission=emission)


@register("verifier", "traversal")
class TraversalVerifier:
    """Lossless tree verification by Traversal Verification (Weng et al., NeurIPS 2025): bottom-up and
    sequence-level, the generalisation of block verification to trees (on a chain it *is* block verification, and
    chains are verified by :class:`~decodekit.verifiers.BlockVerifier`'s vectorised code).

    Leaves are visited in post-order; a leaf is accepted with the probability ``α`` that its whole path is
    accepted, and a rejected leaf is deleted while its parent's target becomes the residual and its ``α`` the
    block-verification stop probability, so later siblings see exactly the recursive-rejection residuals. The rule
    follows ``shared/papers/verifiers.md`` §5.5, variant (a) for i.i.d. siblings (each path its own nodes, ``q``
    unchanged) and (b) for siblings drawn without replacement (the parent's ``q`` loses each rejected sibling);
    deterministic trees are point masses. Checked by exact enumeration (``tests/unit/test_tree_verifiers.py``),
    including equality with block verification on chains.

    Cost: ``N`` sequential steps of ``[B, V]`` work and one host sync per round; the draws are one coin per visit
    (``uniform(key="coins")``, ``[B, N + 1]``) and ``sample(key="next")``.
    """

    accepts = frozenset(DraftKind)
    lossless = True

    def verify(self, draft: Draft, logits: torch.Tensor, sampling: SamplingParams, generator: Generator) -> Verdict:
        if draft.is_chain:
            return BlockVerifier().verify(draft, logits, sampling, generator)
        p, empty = tree_probs(draft, logits, sampling, generator)
        if empty is not None:
            return empty
        return visit(draft, traversal_plan(draft, p, draw_laws(draft, p)), generator)
