"""Speculative sampling (Leviathan et al. 2023; Chen et al. 2023) for chain drafts."""

from __future__ import annotations

import torch

from decodekit.registry import register
from decodekit.sampling import Generator, uniform
from decodekit.types import Draft, Verdict
from decodekit.verifiers.chain import ChainVerifier, chain_verdict


@register("verifier", "rejection")
class RejectionVerifier(ChainVerifier):
    """Lossless speculative sampling of a chain draft.

    With ``p`` the target's warped distribution and ``q`` the one each draft token was drawn from, token ``x_i``
    is accepted with probability ``min(1, p(x_i) / q(x_i))`` until the first rejection; the next token is drawn
    from ``norm(max(p - q, 0))`` at the rejected position, or from ``p`` after the last token (bonus).
    Deterministic drafts are point masses (``q = one-hot``): accept with probability ``p(x)``, residual ``p``
    with ``x`` removed. At temperature 0 this is greedy decoding.

    Only valid nodes are read: unused slots may hold any id (``-1`` padding of ragged chains) and any ``q``.
    Draws: ``uniform(key="coins")`` (``[B, N]``, one coin per node) and ``sample(key="next")`` (the next token),
    so with :class:`~decodekit.sampling.RowGenerators` a row's verdict does not depend on the other rows.
    """

    def verify_chain(self, draft: Draft, p: torch.Tensor, tokens: torch.Tensor, generator: Generator) -> Verdict:
        batch, n = draft.tokens.shape
        rows = torch.arange(batch, device=p.device)
        p_x = p[:, :n].gather(-1, tokens[..., None])[..., 0]
        q_x = draft.q_of_tokens()  # 1 for point masses
        coins = uniform((batch, n), generator, p.device, key="coins")
        ok = draft.valid & (q_x > 0) & (coins * q_x < p_x)
        num = ok.long().cumprod(-1).sum(-1)
        target = p[rows, num]  # [B, V]: the target row after the last accepted token
        rejected = num < draft.num_valid  # computed for every row: deciding whether any was rejected is a host sync
        at = num.clamp(max=n - 1)
        if draft.kind.needs_q:
            residual = (target - draft.node_q()[rows, at].float()).clamp_(min=0)
        else:
            residual = target.scatter(1, tokens[rows, at][:, None], 0.0)
        return chain_verdict(draft, num, target, residual, rejected, generator)
