"""What the sampling verifiers of chain drafts share: the target's distributions and the plain step of an empty
draft (:func:`chain_probs`), the next token from a residual with its fallback (:func:`chain_verdict`), and their
frame (:class:`ChainVerifier`)."""

from __future__ import annotations

import torch

from decodekit.errors import IncompatibleDraftError
from decodekit.sampling import Generator, sample
from decodekit.types import Draft, DraftKind, SamplingParams, Verdict
from decodekit.verifiers.tree import tree_probs


def chain_probs(
    name: str, draft: Draft, logits: torch.Tensor, sampling: SamplingParams, generator: Generator
) -> tuple[torch.Tensor, Verdict | None]:
    """The warped target ``p [B, N + 1, V]``, and the verdict itself when the draft is empty (plain sampling of
    the next token); refuses a tree draft, naming the verifier ``name``."""
    if not draft.is_chain:
        raise IncompatibleDraftError(f"{name} verifies chains only; use a tree verifier for tree drafts")
    return tree_probs(draft, logits, sampling, generator)


def chain_verdict(
    draft: Draft,
    num: torch.Tensor,
    target: torch.Tensor,
    residual: torch.Tensor,
    rejected: torch.Tensor,
    generator: Generator,
) -> Verdict:
    """The verdict of ``num [B]`` accepted tokens: the next token from ``residual [B, V]`` where the row was
    ``rejected`` before its draft's end, else (and where rounding emptied the residual) from ``target [B, V]``."""
    usable = rejected & (residual.sum(-1) > 0)
    target = torch.where(usable[:, None], residual, target)
    return Verdict(
        accepted=draft.path(num - 1, num), num_accepted=num, next_token=sample(target, generator, key="next")
    )


class ChainVerifier:
    """The shared frame of the lossless chain verifiers: refuse a tree, sample plainly after an empty draft, else
    :meth:`verify_chain` on the warped target ``p [B, N + 1, V]`` and the draft's ``tokens [B, N]`` (unused slots
    read as id 0, safe to gather with: they may hold ``-1``)."""

    accepts = frozenset(DraftKind)  # on a chain, sampling without replacement is plain sampling
    lossless = True

    def verify(self, draft: Draft, logits: torch.Tensor, sampling: SamplingParams, generator: Generator) -> Verdict:
        p, empty = chain_probs(type(self).__name__, draft, logits, sampling, generator)
        if empty is not None:
            return empty
        return self.verify_chain(draft, p, draft.tokens.where(draft.valid, 0), generator)

    def verify_chain(self, draft: Draft, p: torch.Tensor, tokens: torch.Tensor, generator: Generator) -> Verdict:
        """The verdict on a non-empty chain ``draft`` (see the class)."""
        raise NotImplementedError(f"{type(self).__name__} must define verify_chain")
