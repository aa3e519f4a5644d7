"""Typical acceptance (Medusa; Cai et al., ICML 2024): a **lossy** verifier."""

from __future__ import annotations

import torch

from decodekit.checks import check_float
from decodekit.registry import register
from decodekit.sampling import Generator, probs_from_logits, sample
from decodekit.types import Draft, DraftKind, SamplingParams, Verdict
from decodekit.verifiers.tree import parent_rows, token_probs


@register("verifier", "typical")
class TypicalAcceptanceVerifier:
    """**Lossy**: Medusa's typical acceptance. The output does *not* follow the target's distribution.

    A node's token ``x`` is accepted when the target after its parent gives it
    ``p(x) > min(posterior_threshold, posterior_alpha * exp(-H(p)))`` (``H`` the entropy in nats of the warped
    target ``p``) and its parent was accepted; the deepest accepted node wins (ties: the larger ``Σ log p`` along
    the path). The next token is sampled from the target after that node; Medusa has no residual, so a rejected
    token can be drawn again, which is where the bias comes from: it favours the drafter's plausible choices.
    At temperature 0 it is greedy matching (lossless there). Defaults are Medusa's ``medusa_generate`` values
    (``posterior_threshold=0.09``, ``posterior_alpha=0.3``); the rule is ``shared/papers/verifiers.md`` §4.
    ``tests/unit/test_tree_verifiers.py`` shows the distribution tests reject it. Any draft kind, chains and
    trees; no host sync.
    """

    accepts = frozenset(DraftKind)
    lossless = False

    def __init__(self, posterior_threshold: float = 0.09, posterior_alpha: float = 0.3) -> None:
        self.posterior_threshold = check_float("posterior_threshold", posterior_threshold, low=0)
        self.posterior_alpha = check_float("posterior_alpha", posterior_alpha, low=0)

    def verify(self, draft: Draft, logits: torch.Tensor, sampling: SamplingParams, generator: Generator) -> Verdict:
        greedy = sampling.greedy
        p = logits.float().softmax(-1) if greedy else probs_from_logits(logits, sampling)  # [B, N + 1, V] float32
        batch = draft.batch_size
        if draft.num_nodes == 0:
            nxt = logits[:, 0].argmax(-1) if greedy else sample(p[:, 0], generator, key="next")
            return Verdict(accepted=draft.tokens, num_accepted=torch.zeros_like(nxt), next_token=nxt)
        tokens = draft.tokens.where(draft.valid, 0)
        rows = parent_rows(draft)
        p_x = token_probs(p, rows, tokens)  # [B, N]
        if greedy:
            ok = tokens == logits.argmax(-1).gather(1, rows)
        else:
            entropy = -(p * p.clamp(min=1e-30).log()).sum(-1)  # [B, N + 1]
            bar = torch.minimum(
                torch.full_like(entropy, self.posterior_threshold), self.posterior_alpha * (-entropy).exp()
            )
            ok = p_x > bar.gather(1, rows)
        ok = ok & draft.valid
        reached = ok & ~(draft.ancestors & ~ok[:, None, :]).any(-1)
        logp = p_x.clamp(min=1e-30).log()
        score = (draft.ancestors.float() @ logp.where(reached, 0)[..., None])[..., 0]  # Σ log p along the path
        depth = torch.where(reached, draft.depth, 0)
        # deepest first, then the likeliest path (scores are <= 0, so they only break ties between depths)
        key = torch.where(reached, depth.float() * 1e6 + score.clamp(min=-1e5), -1.0)
        leaf = key.argmax(-1)
        num = depth.gather(1, leaf[:, None])[:, 0]
        row = torch.where(num > 0, leaf + 1, 0)
        b = torch.arange(batch, device=row.device)
        nxt = logits[b, row].argmax(-1) if greedy else sample(p[b, row], generator, key="next")
        return Verdict(accepted=draft.path(leaf, num), num_accepted=num, next_token=nxt)
