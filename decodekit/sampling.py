"""The one implementation of logit warping and seeded sampling, used by the target, drafters and verifiers.

Warping follows transformers' order and semantics: temperature, then top-k, then top-p (nucleus). Greedy
decoding (``temperature == 0``) is a point mass on the argmax (first index on ties, as ``torch.argmax``).
All probabilities are float32.
"""

from __future__ import annotations

import torch

from decodekit.types import SamplingParams


def warp_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Apply temperature, top-k and top-p to logits ``[..., V]``; removed entries become ``-inf`` (float32).

    Not defined for greedy params (use :func:`probs_from_logits`, which returns the argmax point mass).
    """
    scores = logits.float() / params.temperature
    if params.top_k is not None and params.top_k < scores.shape[-1]:
        kth = torch.topk(scores, params.top_k, dim=-1).values[..., -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if params.top_p is not None and params.top_p < 1.0:
        sorted_scores, order = torch.sort(scores, dim=-1, descending=False)
        cumulative = sorted_scores.softmax(dim=-1).cumsum(dim=-1)
        remove = cumulative <= (1.0 - params.top_p)
        remove[..., -1] = False  # always keep the most likely token
        scores = scores.masked_fill(remove.scatter(-1, order, remove), float("-inf"))
    return scores


def probs_from_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """The distribution plain decoding samples from: ``[..., V]`` float32 probabilities.

    Greedy params give a one-hot at the argmax.
    """
    if params.greedy:
        out = torch.zeros(logits.shape, dtype=torch.float32, device=logits.device)
        return out.scatter_(-1, logits.argmax(-1, keepdim=True), 1.0)
    return warp_logits(logits, params).softmax(-1)


def sample(probs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """Draw one token per row from ``probs [..., V]`` (need not be normalised; must have positive mass).

    Uses the exponential race ``argmax(p / E)``, ``E ~ Exp(1)``: exact, batched, and reproducible with
    ``generator``. Returns ``[...]`` long.
    """
    noise = torch.empty_like(probs, dtype=torch.float32).exponential_(generator=generator)
    return (probs.float() / noise.clamp_(min=1e-30)).argmax(-1)


def next_token(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None = None) -> torch.Tensor:
    """Plain decoding of one token from ``logits [..., V]``: argmax when greedy, else a warped sample."""
    if params.greedy:
        return logits.argmax(-1)
    return sample(probs_from_logits(logits, params), generator)


def uniform(shape: tuple[int, ...], generator: torch.Generator | None, device: torch.device) -> torch.Tensor:
    """``U[0, 1)`` float32 draws of ``shape`` from ``generator`` (the accept coins of verifiers)."""
    return torch.rand(shape, generator=generator, device=device, dtype=torch.float32)
