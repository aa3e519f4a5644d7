"""Fixed draft length."""

from __future__ import annotations

import torch

from decodekit.checks import check_int
from decodekit.registry import register
from decodekit.state import DecodeState
from decodekit.types import DraftBudget


@register("policy", "fixed")
class FixedLength:
    """Draft ``k`` tokens every round (``k = 0`` turns speculation off)."""

    def __init__(self, k: int = 4) -> None:
        self.k = check_int("k", k, low=0, hint=" (the draft length; 0 = no speculation)")

    def plan(self, state: DecodeState) -> DraftBudget:
        return DraftBudget(torch.full_like(state.lengths, self.k), node_bound=self.k)
