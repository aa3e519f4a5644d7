"""SpecTr's K-SEQ (Sun, Suresh, Ro, Beirami, Jain, Yu; NeurIPS 2023): optimal-transport verification of i.i.d.
draft siblings."""

from __future__ import annotations

import torch

from decodekit.errors import IncompatibleDraftError
from decodekit.registry import register
from decodekit.sampling import Generator
from decodekit.types import Draft, DraftKind, SamplingParams, Verdict
from decodekit.verifiers.specinfer import rrs_plan
from decodekit.verifiers.tree import (
    TINY,
    WalkPlan,
    draw_laws,
    likelihood_ratio,
    parent_rows,
    token_probs,
    tree_probs,
    walk,
)

BISECTION_STEPS = 32  # ρ* to within (k - 1) / 2^32, rounded up


def kseq_rho(p: torch.Tensor, q: torch.Tensor, k: torch.Tensor, steps: int = BISECTION_STEPS) -> torch.Tensor:
    """``ρ*`` per row: the root in ``[1, k]`` of ``1 - (1 - β(ρ))^k = ρ β(ρ)``, ``β(ρ) = Σ_x min(p(x) / ρ, q(x))``.

    Bisection in float64 on the decreasing difference; returns the **upper** end, so the K-SEQ residual stays
    non-negative (``verifiers.md`` §5.4: rounding ρ down biases the output).

    Args:
        p, q: ``[R, V]`` target and draft distributions.
        k: ``[R]`` number of i.i.d. siblings (>= 1).
    """
    p, q, k = p.double(), q.double(), k.double()
    lo, hi = torch.ones_like(k), k.clone()
    for _ in range(steps):
        mid = (lo + hi) / 2
        beta = torch.minimum(p / mid[:, None], q).sum(-1)
        above = 1 - (1 - beta) ** k >= mid * beta  # the root lies above mid
        lo, hi = torch.where(above, mid, lo), torch.where(above, hi, mid)
    return hi


def kseq_plan(draft: Draft, p: torch.Tensor, laws: torch.Tensor) -> WalkPlan:
    """K-SEQ's plan for a tree whose siblings are i.i.d. draws from their parent's ``q``.

    At a node with ``k`` children, child ``x`` passes with ``min(1, p(x) / (ρ* q(x)))``, the coins independent, and
    the first passing child is taken; if none passes, the next token comes from
    ``norm(max(p - min(p / ρ*, q) γ, 0))`` with ``γ = (1 - (1 - β)^k) / β`` (``p`` where ``β = 0``). With ``k = 1``
    this is speculative sampling. Host syncs: one (which parents have two or more children).
    """
    batch, n = draft.tokens.shape
    vocab = p.shape[-1]
    tokens = draft.tokens.where(draft.valid, 0)
    rows = parent_rows(draft)
    k = torch.zeros(batch, n + 1, dtype=torch.long, device=p.device).scatter_add_(1, rows, draft.valid.long())
    q = torch.zeros(batch, n + 2, vocab, dtype=p.dtype, device=p.device)  # each parent's q (row n + 1: scratch)
    q.scatter_(1, torch.where(draft.valid, rows, n + 1)[..., None].expand(-1, -1, vocab), laws)
    q = q[:, : n + 1]
    rho = torch.ones(batch, n + 1, dtype=torch.float64, device=p.device)
    wide = (k >= 2).nonzero()  # the one host sync
    if len(wide):
        b, r = wide[:, 0], wide[:, 1]
        rho[b, r] = kseq_rho(p[b, r], q[b, r], k[b, r])
    rho_t = rho.to(p.dtype)
    beta = torch.minimum(p / rho_t[..., None], q).sum(-1)  # [B, N + 1]
    kf = k.to(p.dtype)
    gamma = torch.where(beta > 0, (1 - (1 - beta) ** kf) / beta.clamp(min=TINY), torch.ones_like(beta))
    rest = (p - torch.minimum(p / rho_t[..., None], q) * gamma[..., None]).clamp(min=0)
    mass = rest.sum(-1, keepdim=True)
    residual = torch.where((mass > 0) & (k[..., None] > 0), rest / mass.clamp(min=TINY), p)
    p_x = token_probs(p, rows, tokens)
    q_x = laws.gather(-1, tokens[..., None])[..., 0]
    rho_x = rho_t.gather(1, rows)
    accept = likelihood_ratio(p_x, rho_x * q_x).clamp(max=1)  # rho >= 1: zero exactly where q_x is
    return WalkPlan(accept=accept.where(draft.valid, 0), residual=residual)


def spectr_plan(draft: Draft, p: torch.Tensor, laws: torch.Tensor) -> WalkPlan:
    """What :class:`SpecTrVerifier` runs: K-SEQ for i.i.d. siblings, the point-mass rule of recursive rejection
    (:func:`~decodekit.verifiers.specinfer.rrs_plan`) for deterministic trees."""
    return (kseq_plan if draft.kind is DraftKind.SAMPLED else rrs_plan)(draft, p, laws)


@register("verifier", "spectr")
class SpecTrVerifier:
    """Lossless tree verification by SpecTr's K-SEQ (Sun et al., NeurIPS 2023) for trees with i.i.d. siblings.

    At each node with ``k`` i.i.d. children the acceptance is relaxed by the factor ``ρ*`` that solves
    ``1 - (1 - β)^k = ρ β`` (found by bisection, rounded up): child ``x`` passes with ``min(1, p(x) / (ρ* q(x)))``,
    the first passing child is taken, and if none passes the next token is drawn from
    ``norm(max(p - min(p / ρ*, q) γ, 0))``, ``γ = (1 - (1 - β)^k) / β``. The paper proves K-SEQ within a factor
    ``1 - 1/e`` of the optimal transport coupling. The rule follows ``shared/papers/verifiers.md`` §5.4 (the
    paper's Algorithm 3 as restated there) and is checked by exact enumeration
    (``tests/unit/test_tree_verifiers.py``).

    i.i.d. means every sibling list holds independent draws from the parent's ``q`` (kind ``SAMPLED``); K
    i.i.d. rollouts qualify. Deterministic trees are verified as point masses by the recursive-rejection rule
    (:class:`~decodekit.verifiers.SpecInferVerifier`), the lossless choice for them; siblings drawn without
    replacement are refused (use ``specinfer`` or ``traversal``). Cost: a ``[B, N + 1, V]`` pass, a 32-step
    bisection over the parents with two or more children, and one host sync per round.
    """

    accepts = frozenset({DraftKind.SAMPLED, DraftKind.DETERMINISTIC})
    lossless = True

    def verify(self, draft: Draft, logits: torch.Tensor, sampling: SamplingParams, generator: Generator) -> Verdict:
        if draft.kind is DraftKind.SAMPLED_WITHOUT_REPLACEMENT:
            raise IncompatibleDraftError(
                "SpecTrVerifier needs i.i.d. siblings; for siblings drawn without replacement use "
                "SpecInferVerifier or TraversalVerifier"
            )
        p, empty = tree_probs(draft, logits, sampling, generator)
        if empty is not None:
            return empty
        return walk(draft, spectr_plan(draft, p, draw_laws(draft, p)), generator)
