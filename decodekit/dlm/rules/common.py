"""Helpers the unmasking rules share: top-k per row, the most confident slot, LLaDA's transfer schedule."""

from __future__ import annotations

import torch


def top_per_row(score: torch.Tensor, eligible: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """``[B, G]`` bool: each row's ``k[b]`` highest-scoring eligible slots (``score [B, G]``, ``eligible [B, G]``
    bool, ``k [B]`` long; ties: the earlier slot; never more than the row's eligible slots)."""
    ranked = score.masked_fill(~eligible, float("-inf")).argsort(dim=-1, descending=True, stable=True)
    take = torch.arange(score.shape[1], device=score.device)[None, :] < k[:, None]
    return torch.zeros_like(eligible).scatter(1, ranked, take) & eligible


def most_confident(confidence: torch.Tensor, eligible: torch.Tensor) -> torch.Tensor:
    """``[B, G]`` bool: each row's most confident eligible slot (none in a row without eligible slots): the one
    commit every threshold-style rule makes so that a step always progresses."""
    return top_per_row(confidence, eligible, torch.ones(len(confidence), dtype=torch.long, device=confidence.device))


def transfer_counts(masked: torch.Tensor, steps: int) -> torch.Tensor:
    """``[B, steps]`` long: LLaDA's per-step commit counts for ``masked [B]`` masked slots over ``steps`` steps:
    ``masked // steps`` each, the remainder one each on the first steps (the linear noise schedule on a uniform
    time grid)."""
    base, rest = masked // steps, masked % steps
    return base[:, None] + (torch.arange(steps, device=masked.device)[None, :] < rest[:, None]).long()
