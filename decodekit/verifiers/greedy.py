"""Greedy verification: accept the longest draft path that matches the target's argmax at every node."""

from __future__ import annotations

import torch

from decodekit.errors import ConfigError
from decodekit.registry import register
from decodekit.sampling import Generator
from decodekit.types import Draft, DraftKind, SamplingParams, Verdict


@register("verifier", "greedy")
class GreedyVerifier:
    """Exact greedy decoding (temperature 0) for chains and trees, any draft kind.

    A node is accepted iff its token is the target's argmax after its parent and its parent was accepted; the
    deepest accepted node wins (the first one on ties, which only arise between identical sibling tokens).
    The next pending token is the argmax after that node. Output equals plain greedy decoding token for token.
    Only valid nodes are read (unused slots may hold any id, e.g. ``-1`` padding); no randomness is drawn.
    """

    accepts = frozenset(DraftKind)
    lossless = True

    def check(self, sampling: SamplingParams) -> None:
        if not sampling.greedy:
            raise ConfigError(
                f"GreedyVerifier reproduces greedy decoding but temperature={sampling.temperature}; "
                "use RejectionVerifier (the default when temperature > 0) or set temperature=0"
            )

    def verify(self, draft: Draft, logits: torch.Tensor, sampling: SamplingParams, generator: Generator) -> Verdict:
        best = logits.argmax(-1)  # [B, N + 1]
        if draft.num_nodes == 0:
            return Verdict(accepted=draft.tokens, num_accepted=torch.zeros_like(best[:, 0]), next_token=best[:, 0])
        match = draft.valid & (draft.tokens == best.gather(1, draft.parents + 1))
        if draft.is_chain:
            num = match.long().cumprod(-1).sum(-1)
            leaf = num - 1
        else:
            reached = match & ~(draft.ancestors & ~match[:, None, :]).any(-1)
            depth = torch.where(reached, draft.depth, 0)
            leaf = depth.argmax(-1)
            num = depth.gather(1, leaf[:, None])[:, 0]
        accepted = draft.path(leaf, num)
        next_row = torch.where(num > 0, leaf + 1, 0)
        return Verdict(accepted=accepted, num_accepted=num, next_token=best.gather(1, next_row[:, None])[:, 0])
