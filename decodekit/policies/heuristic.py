"""transformers' ``num_assistant_tokens_schedule="heuristic"``: +2 after a fully accepted draft, else -1."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from decodekit.checks import check_int
from decodekit.errors import ConfigError
from decodekit.policies.lengths import drafted_depth, length_budget
from decodekit.registry import register
from decodekit.spec.state import DecodeState
from decodekit.types import DraftBudget

if TYPE_CHECKING:
    from decodekit.spec.round import Round


_STEPS = ("initial", "increase", "decrease")


@register("policy", "heuristic")
class HeuristicLength:
    """Per-row draft length that grows by ``increase`` when every drafted token was accepted (for a tree: a path to
    its deepest node) and shrinks by ``decrease`` otherwise, within ``[min_len, max_len]``. Rounds that drafted
    nothing leave it unchanged.

    State is per call (like ``heuristic_transient``): each :func:`~decodekit.generate` starts at ``initial``.
    """

    def __init__(
        self, initial: int = 5, increase: int = 2, decrease: int = 1, min_len: int = 1, max_len: int = 64
    ) -> None:
        initial, increase, decrease = (check_int(n, v, low=0) for n, v in zip(_STEPS, (initial, increase, decrease)))
        min_len = check_int("min_len", min_len, low=1, hint=" (a row at length 0 would never draft again)")
        max_len = check_int("max_len", max_len, low=1)
        if not min_len <= initial <= max_len:
            raise ConfigError(f"need 1 <= min_len <= initial <= max_len, got {min_len}, {initial}, {max_len}")
        self.initial, self.increase, self.decrease = initial, increase, decrease
        self.min_len, self.max_len = min_len, max_len
        self.lengths: torch.Tensor | None = None

    def begin(self, state: DecodeState) -> None:
        self.lengths = torch.full_like(state.lengths, self.initial)

    def plan(self, state: DecodeState) -> DraftBudget:
        if self.lengths is None:  # used outside generate(), which calls begin()
            self.begin(state)
        return length_budget(self.lengths.clone())  # one read of the lengths, which serve as the host mirrors

    def observe(self, state: DecodeState, round: Round) -> None:
        drafted = drafted_depth(round.draft)  # a chain's length; a tree's depth
        step = torch.where(round.verdict.num_accepted == drafted, self.increase, -self.decrease)
        step = torch.where(drafted > 0, step, 0)
        self.lengths = (self.lengths + step).clamp(self.min_len, self.max_len)

    def select_rows(self, rows: torch.Tensor) -> None:
        self.lengths = self.lengths[rows]
