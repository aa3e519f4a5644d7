"""Goodness-of-fit helpers for the losslessness tests (no scipy needed)."""

from __future__ import annotations

import torch


def _flat(x: torch.Tensor) -> torch.Tensor:
    """``x`` as a flat float64 tensor outside autograd (a test may pass a model's probabilities as they are)."""
    return x.detach().double().flatten()


def chi_square_pvalue(counts: torch.Tensor, probs: torch.Tensor, min_expected: float = 5.0) -> float:
    """Pearson chi-square p-value of ``counts`` against ``probs`` (both flat); cells with expected count below
    ``min_expected`` are merged into one."""
    counts, probs = _flat(counts), _flat(probs)
    n = counts.sum()
    expected = probs * n
    small = expected < min_expected
    obs = torch.cat([counts[~small], counts[small].sum()[None]])
    exp = torch.cat([expected[~small], expected[small].sum()[None]])
    keep = exp > 0
    obs, exp = obs[keep], exp[keep]
    stat = ((obs - exp) ** 2 / exp).sum()
    df = obs.numel() - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2.0, dtype=torch.float64), stat / 2.0))


def total_variation(counts: torch.Tensor, probs: torch.Tensor) -> float:
    empirical = _flat(counts) / counts.sum()
    return 0.5 * float((empirical - _flat(probs)).abs().sum())


def tv_noise(probs: torch.Tensor, n: int) -> float:
    """Expected total variation of an n-sample empirical distribution from ``probs`` (sampling noise only)."""
    p = _flat(probs)
    return float(0.5 * torch.sqrt(2 * p * (1 - p) / (torch.pi * n)).sum())
