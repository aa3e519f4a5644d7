"""Block verification (Sun, Mendlovic, Leviathan, Aharoni, Ro, Beirami, Suresh; ICLR 2025, arXiv 2403.10444)."""

from __future__ import annotations

import torch

from decodekit.registry import register
from decodekit.sampling import Generator, uniform
from decodekit.types import Draft, Verdict
from decodekit.verifiers.chain import ChainVerifier, chain_verdict
from decodekit.verifiers.tree import likelihood_ratio


def block_plan(
    p: torch.Tensor, q: torch.Tensor, tokens: torch.Tensor, lengths: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The deterministic part of block verification for chains of ``lengths [B]`` valid tokens (``γ_b``).

    Args:
        p: ``[B, N + 1, V]`` the target's distributions; row ``i`` follows the first ``i`` draft tokens.
        q: ``[B, N, V]`` the distribution each draft token was drawn from (one-hot for deterministic drafts).
        tokens: ``[B, N]`` the draft tokens (any id in ``[0, V)`` at invalid slots).
        lengths: ``[B]`` valid tokens per row.

    Returns:
        ``h [B, N + 1]``: ``h[:, i]`` is the probability of the coin ``η_i < h_i`` that lets the block stop at
        ``τ >= i`` (``h[:, 0] = 0``; ``0`` past a row's length), and ``a [B, N + 1]``, the clipped joint ratios
        ``a_0 = 1``, ``a_i = min(1, a_{i-1} p_i(x_i) / q_i(x_i))``. ``τ = max{i : η_i < h_i}``; the next token
        comes from ``norm(max(a_τ p_{τ+1} - q_{τ+1}, 0))`` when ``τ < γ``, from ``p_{γ+1}`` when ``τ = γ``.
    """
    batch, n = tokens.shape
    p_x = p[:, :n].gather(-1, tokens[..., None])[..., 0]
    q_x = q.gather(-1, tokens[..., None])[..., 0]
    ratio = likelihood_ratio(p_x, q_x)
    a = [torch.ones(batch, dtype=p.dtype, device=p.device)]
    for i in range(n):
        a.append(torch.minimum(a[-1] * ratio[:, i], torch.ones_like(ratio[:, i])))
    a_t = torch.stack(a, 1)  # [B, N + 1]
    residual_mass = (a_t[:, :n, None] * p[:, :n] - q).clamp(min=0).sum(-1)  # m_i, i = 0..N-1
    denominator = residual_mass + 1 - a_t[:, :n]
    h_inner = torch.where(denominator > 0, residual_mass / denominator.clamp(min=1e-30), torch.ones_like(denominator))
    index = torch.arange(n + 1, device=p.device)
    h = torch.cat([torch.zeros_like(h_inner[:, :1]), h_inner[:, 1:], torch.zeros_like(h_inner[:, :1])], 1)
    h = torch.where(index == lengths[:, None], a_t, h)  # h_γ = a_γ
    h = torch.where((index >= 1) & (index <= lengths[:, None]), h, torch.zeros_like(h))
    return h, a_t


@register("verifier", "block")
class BlockVerifier(ChainVerifier):
    """Lossless block verification of a chain draft: the speculative-sampling variant that verifies the draft
    as a whole instead of token by token (Sun et al., ICLR 2025), never accepting fewer tokens in expectation than
    :class:`~decodekit.verifiers.RejectionVerifier` and optimal among verifiers that see only on-path
    probabilities.

    With ``a_i`` the clipped joint likelihood ratio of the first ``i`` draft tokens, the residual mass after
    prefix ``i`` is ``m_i = Σ_y max(a_i p_{i+1}(y) - q_{i+1}(y), 0)``, and the block may stop at ``i`` with
    probability ``h_i = m_i / (m_i + 1 - a_i)`` (``h_γ = a_γ``). One coin per position; ``τ`` is the last position
    whose coin passes; the next token is a correction from ``norm(max(a_τ p_{τ+1} - q_{τ+1}, 0))`` (``a_0 = 1``
    gives speculative sampling's first residual) or the bonus from ``p``. The rule is the paper's Algorithm 2 as
    restated in ``shared/papers/verifiers.md`` §3, checked by exact enumeration (``tests/unit/test_block.py``),
    including the paper's binary example (expected accepted tokens 11/9 against 10/9 for token-wise rejection).
    Deterministic drafts are point masses (``q`` one-hot); at temperature 0 it is greedy decoding.

    Draws: ``uniform(key="coins")`` (``[B, N]``) and ``sample(key="next")``, as the rejection verifier.
    """

    def verify_chain(self, draft: Draft, p: torch.Tensor, tokens: torch.Tensor, generator: Generator) -> Verdict:
        batch, n = draft.tokens.shape
        q = draft.node_q()
        q = torch.zeros_like(p[:, :n]).scatter_(-1, tokens[..., None], 1.0) if q is None else q.float()
        lengths = draft.num_valid
        h, a = block_plan(p, q, tokens, lengths)
        coins = uniform((batch, n), generator, p.device, key="coins")
        passed = coins < h[:, 1:]  # [B, N]: η_i < h_i, i = 1..N
        index = torch.arange(1, n + 1, device=p.device)
        num = (passed * index).amax(-1)  # τ: the last passing position, 0 if none
        rows = torch.arange(batch, device=p.device)
        target = p[rows, num]  # the bonus row (τ = γ) or the target after τ tokens
        at = num.clamp(max=n - 1)
        residual = (a[rows, num][:, None] * target - q[rows, at]).clamp(min=0)
        return chain_verdict(draft, num, target, residual, num < lengths, generator)
