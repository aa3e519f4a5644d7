"""What the DLM unit tests share: the mask id of their tiny models, the tiny model itself, and a cache step's
logits in dense form."""

from __future__ import annotations

import torch

import decodekit as dk
from decodekit.models.tiny import tiny_llama

MASK = 127


def peaked_llama() -> torch.nn.Module:
    """A tiny Llama with peaked distributions: confidences far apart, no near-ties."""
    return tiny_llama(3, init=0.6)


def dense(logits) -> torch.Tensor:
    """``[B, G, V]`` of a cache's step, whichever form it returned."""
    return dk.dlm.dense_logits(logits, 8)
