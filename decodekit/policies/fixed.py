"""Fixed draft length."""

from __future__ import annotations

import torch

from decodekit.errors import ConfigError
from decodekit.registry import register
from decodekit.state import DecodeState
from decodekit.types import DraftBudget


@register("policy", "fixed")
class FixedLength:
    """Draft ``k`` tokens every round (``k = 0`` turns speculation off)."""

    def __init__(self, k: int = 4) -> None:
        if k < 0:
            raise ConfigError(f"draft length k must be >= 0, got {k}")
        self.k = k

    def plan(self, state: DecodeState) -> DraftBudget:
        return DraftBudget(torch.full_like(state.lengths, self.k), node_bound=self.k)
