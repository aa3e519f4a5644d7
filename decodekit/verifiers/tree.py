"""What the tree verifiers share: the target's distributions (:func:`tree_probs`), the law each node was drawn
from given its earlier siblings (:func:`draw_laws`), the two exact plans a tree verifier reduces to, and the
samplers that turn a plan into a verdict.

A lossless tree verifier is split, as ``shared/papers/verifiers.md`` §0 suggests, into a deterministic **plan**
and a **sampling** step, so that tests can enumerate every outcome exactly:

* :class:`WalkPlan` (top-down verifiers: SpecInfer, SpecTr): from the root, the children of the current node are
  tried in draw order; child ``i`` is accepted with probability ``accept[i]`` given that its earlier siblings were
  rejected; the first accepted child becomes the current node; when every child is rejected the next token is
  drawn from the node's ``residual`` row (a leaf's residual is the target itself: the bonus token).
* :class:`SequencePlan` (Traversal verification): candidates are visited in a fixed order; candidate ``j`` (a node,
  or the root, which is always accepted) is accepted with probability ``alpha[j]`` given that the earlier ones were
  rejected, and emits its path and a token drawn from ``emission[j]``.

Shapes: ``B`` rows, ``N`` draft nodes, ``V`` vocabulary. Row ``0`` of ``[B, N + 1, ...]`` tensors is the root (the
pending token), row ``i + 1`` is node ``i``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from decodekit.draft import Draft, DraftKind
from decodekit.sampling import Generator, probs_from_logits, sample, uniform
from decodekit.types import SamplingParams, Verdict

TINY = 1e-30


def tree_probs(
    draft: Draft, logits: torch.Tensor, sampling: SamplingParams, generator: Generator
) -> tuple[torch.Tensor, Verdict | None]:
    """The warped target ``p [B, N + 1, V]`` (float32), and the verdict itself when the draft is empty (plain
    sampling of the next token)."""
    p = probs_from_logits(logits, sampling)
    if draft.num_nodes:
        return p, None
    nxt = sample(p[:, 0], generator, key="next")
    return p, Verdict(accepted=draft.tokens, num_accepted=torch.zeros_like(nxt), next_token=nxt)


def earlier_siblings(draft: Draft) -> torch.Tensor:
    """``[B, N, N]`` bool: ``[b, i, j]`` iff valid node ``j`` has node ``i``'s parent and was drawn before ``i``."""
    n = draft.num_nodes
    same = draft.parents[:, :, None] == draft.parents[:, None, :]
    before = torch.ones(n, n, dtype=torch.bool, device=draft.tokens.device).tril(-1)
    return same & before & draft.valid[:, :, None] & draft.valid[:, None, :]


def parent_rows(draft: Draft) -> torch.Tensor:
    """``[B, N]`` the row of each node's parent in ``[B, N + 1, ...]`` tensors (0 = the root)."""
    return (draft.parents + 1).clamp(min=0)


def draw_laws(draft: Draft, like: torch.Tensor) -> torch.Tensor:
    """``[B, N, V]`` the law each node was drawn from **given its earlier siblings** (dtype and device of ``like``):

    * ``SAMPLED`` (i.i.d. siblings): the parent's ``q``;
    * ``SAMPLED_WITHOUT_REPLACEMENT``: the parent's ``q`` with the earlier siblings' tokens removed, renormalised;
    * ``DETERMINISTIC``: the point mass at the node's own token (the EAGLE-2 / q-one-hot rule).

    Every tree verifier here tests node ``i`` against this law; that single convention is what makes them
    lossless for all three drafting processes (``verifiers.md`` §5.0, §5.3).
    """
    tokens = draft.tokens.where(draft.valid, 0)
    vocab = like.shape[-1]
    if draft.kind is DraftKind.DETERMINISTIC:
        return torch.zeros(*tokens.shape, vocab, dtype=like.dtype, device=like.device).scatter_(
            -1, tokens[..., None], 1
        )
    q = draft.node_q().to(like.dtype)
    if draft.kind is DraftKind.SAMPLED:
        return q
    b, n = tokens.shape
    earlier = earlier_siblings(draft).to(like.dtype)
    removed = torch.zeros(b, n, vocab, dtype=like.dtype, device=like.device)
    removed.scatter_add_(2, tokens[:, None, :].expand(b, n, n), earlier)
    q = q.masked_fill(removed > 0, 0)
    return q / q.sum(-1, keepdim=True).clamp(min=TINY)


def likelihood_ratio(p_x: torch.Tensor, q_x: torch.Tensor) -> torch.Tensor:
    """``p(x) / q(x)`` elementwise, ``0`` where ``q(x) = 0`` (a token its own law could not have drawn is rejected)."""
    return torch.where(q_x > 0, p_x / q_x.clamp(min=TINY), torch.zeros_like(p_x))


def token_probs(probs: torch.Tensor, rows: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """``probs[b, rows[b, i], tokens[b, i]]`` for ``probs [B, R, V]``, ``rows``/``tokens [B, N]`` -> ``[B, N]``."""
    vocab = probs.shape[-1]
    return probs.reshape(probs.shape[0], -1).gather(1, rows * vocab + tokens)


# ------------------------------------------------------------------------------------------------- plans
@dataclass(frozen=True, eq=False)
class WalkPlan:
    """The exact plan of a top-down tree verifier.

    Attributes:
        accept: ``[B, N]`` probability that node ``i`` is accepted once its parent was reached and its earlier
            siblings were rejected (0 at invalid nodes).
        residual: ``[B, N + 1, V]`` normalised: where the next token comes from when the walk stops at that row
            (every child rejected; a leaf's row is the target: the bonus).
    """

    accept: torch.Tensor
    residual: torch.Tensor


@dataclass(frozen=True, eq=False)
class SequencePlan:
    """The exact plan of a verifier that visits candidates in a fixed order (Traversal verification).

    Attributes:
        order: ``[B, N + 1]`` the node visited at each step (``-1`` = the root, always last; ``-1`` also pads).
        alpha: ``[B, N + 1]`` probability of accepting visit ``j`` given that visits ``< j`` were rejected
            (``1`` at the root's visit, ``0`` at padding).
        emission: ``[B, N + 1, V]`` normalised: the next token's law when visit ``j`` is accepted.
    """

    order: torch.Tensor
    alpha: torch.Tensor
    emission: torch.Tensor


def walk(draft: Draft, plan: WalkPlan, generator: Generator) -> Verdict:
    """Sample a :class:`WalkPlan`: one coin per node (``uniform(key="coins")``, ``[B, N]``), the first passing child
    of each reached node is taken, the next token is drawn from the residual row where the walk stops
    (``sample(key="next")``). Vectorised: no host sync, no loop over the tree."""
    batch, n = draft.tokens.shape
    coins = uniform((batch, n), generator, plan.accept.device, key="coins")
    passed = draft.valid & (coins < plan.accept)
    first = passed & ~(earlier_siblings(draft) & passed[:, None, :]).any(-1)
    reached = first & ~(draft.ancestors & ~first[:, None, :]).any(-1)  # every node on its path is a first pass
    depth = torch.where(reached, draft.depth, 0)
    leaf = depth.argmax(-1)
    num = depth.gather(1, leaf[:, None])[:, 0]
    row = torch.where(num > 0, leaf + 1, 0)
    rows = torch.arange(batch, device=row.device)
    nxt = sample(plan.residual[rows, row], generator, key="next")
    return Verdict(accepted=draft.path(leaf, num), num_accepted=num, next_token=nxt)


def visit(draft: Draft, plan: SequencePlan, generator: Generator) -> Verdict:
    """Sample a :class:`SequencePlan`: one coin per visit (``uniform(key="coins")``, ``[B, N + 1]``); the first visit
    whose coin passes is accepted (the root's always does) and the next token drawn from its emission row."""
    batch = draft.batch_size
    coins = uniform(tuple(plan.alpha.shape), generator, plan.alpha.device, key="coins")
    passed = coins < plan.alpha
    first = passed.long().argmax(-1)  # the root's visit has alpha = 1, so some visit passes
    rows = torch.arange(batch, device=first.device)
    node = plan.order[rows, first]
    num = torch.where(node >= 0, draft.depth.gather(1, node.clamp(min=0)[:, None])[:, 0], 0)
    nxt = sample(plan.emission[rows, first], generator, key="next")
    return Verdict(accepted=draft.path(node, num), num_accepted=num, next_token=nxt)
