"""Synthetic rounds and states for the length policies' trace tests (no model involved)."""

from __future__ import annotations

import torch

import decodekit as dk


def chain_round(drafted, accepted, width: int = 8, kl: torch.Tensor | None = None) -> dk.Round:
    """A round in which row ``b`` drafted a chain of ``drafted[b]`` tokens and accepted ``accepted[b]`` of them;
    ``kl [B, width]`` is handed to the policy as ``Round.kl``."""
    drafted, accepted = torch.tensor(drafted), torch.tensor(accepted)
    draft = dk.Draft.chain(
        torch.zeros(len(drafted), width, dtype=torch.long), valid=torch.arange(width) < drafted[:, None]
    )
    verdict = dk.Verdict(torch.zeros(len(drafted), width, dtype=torch.long), accepted, torch.zeros_like(accepted))
    return dk.Round(0, draft, verdict, verdict.accepted, accepted + 1, kl=kl)


def dummy_state(rows: int, sampling: dk.SamplingParams | None = None) -> dk.DecodeState:
    """A state of ``rows`` one-token prompts with room for 100 new tokens each (greedy unless ``sampling``)."""
    sampling = sampling or dk.SamplingParams()
    return dk.DecodeState.from_prompts([[1]] * rows, [100] * rows, sampling, None, torch.device("cpu"))
