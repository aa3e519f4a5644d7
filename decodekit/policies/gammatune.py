"""GammaTune / GammaTune+ (Gautam, Shrestha, Reddy 2025): a smoothed draft length that follows the acceptance of
each round, growing faster than it shrinks; GammaTune+ also stops a draft early when the drafter grows unsure."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from decodekit.checks import check_float, check_int
from decodekit.errors import ConfigError
from decodekit.policies.confidence import ConfidenceStop
from decodekit.policies.lengths import check_tree_args, drafted_depth, length_budget
from decodekit.registry import register
from decodekit.state import DecodeState
from decodekit.types import DraftBudget

if TYPE_CHECKING:
    from decodekit.round import Round


@register("policy", "gammatune")
class GammaTune:
    """GammaTune's acceptance-driven length (Gautam, Shrestha, Reddy 2025, arXiv 2504.00030).

    Per row a real-valued length ``g``; each round drafts ``k = clip(round(g), min_len, max_len)``. After the round,
    with ``a`` accepted of a draft of depth ``d``, the target is ``y = a + 1`` if all ``d`` passed (probe one longer)
    and ``y = a`` otherwise (the length that was safe), and ``g <- (1 - eta) g + eta y`` with ``eta = up`` when
    ``y > g`` and ``down`` otherwise: the switch between a fast and a slow gain damps the +2/-1 oscillation of
    transformers' heuristic. Rows that drafted nothing keep ``g``.

    ``threshold`` adds GammaTune+'s confidence gate: a step-wise drafter stops after a token it drew with
    probability below ``threshold`` (the token is kept), and ``g`` only caps the round; a draft cut short by the gate
    that was fully accepted still counts as "all passed" (``y = a + 1``). Registered as ``gammatune_plus``
    (:class:`GammaTunePlus`, ``threshold = 0.4``).

    Faithfulness: **reconstruction.** The paper's abstract describes a training-free, heuristic-based switching
    mechanism driven by token acceptance (and for GammaTune+ a confidence signal) but not its equations; the rule
    above is decodekit's (``policies.md`` section 2), chosen to match that description. Keep its defaults
    (``up = 0.5``, ``down = 0.25``) until checked against the paper's text.

    Works for chains and tree budgets (``nodes_per_depth``: ``k`` is the depth, ``d`` the deepest drafted node).
    No host syncs: the budget's bound is ``max_len``.

    Args:
        initial: ``g`` at the start of each call (None = 4, within the bounds).
        up, down: the gains when the target is above / not above ``g``, in ``(0, 1]``.
        min_len, max_len: bounds of the drafted length.
        threshold: None, or GammaTune+'s confidence gate (a probability).
        nodes_per_depth, width: tree budgets (:func:`~decodekit.policies.lengths.length_budget`).
    """

    def __init__(
        self,
        initial: float | None = None,
        up: float = 0.5,
        down: float = 0.25,
        min_len: int = 1,
        max_len: int = 16,
        threshold: float | None = None,
        nodes_per_depth: int = 1,
        width: int | None = None,
    ) -> None:
        self.min_len = check_int("min_len", min_len, low=1, hint=" (a row at length 0 would never draft again)")
        self.max_len = check_int("max_len", max_len, low=1)
        default = float(min(max(4, self.min_len), self.max_len))
        self.initial = default if initial is None else check_float("initial", initial, low=0.0)
        if not self.min_len <= self.initial <= self.max_len:
            raise ConfigError(f"need min_len <= initial <= max_len, got {min_len}, {self.initial}, {max_len}")
        self.up = check_float("up", up, low=0.0, high=1.0, low_open=True, hint=" (the gain when lengthening)")
        self.down = check_float("down", down, low=0.0, high=1.0, low_open=True, hint=" (the gain when shortening)")
        self.gate = None if threshold is None else ConfidenceStop(threshold, self.max_len)
        self.threshold = None if self.gate is None else self.gate.threshold
        self.nodes_per_depth, self.width = check_tree_args(nodes_per_depth, width)
        self.gamma: torch.Tensor | None = None  # [B] float64, the smoothed length

    def begin(self, state: DecodeState) -> None:
        self.gamma = torch.full(state.lengths.shape, self.initial, dtype=torch.float64, device=state.device)

    def plan(self, state: DecodeState) -> DraftBudget:
        if self.gamma is None or self.gamma.shape[0] != state.batch_size:
            self.begin(state)
        k = self.gamma.round().long().clamp(self.min_len, self.max_len)
        stop = None if self.gate is None else self.gate.stop
        return length_budget(k, self.max_len, self.nodes_per_depth, self.width, stop)

    def observe(self, state: DecodeState, round: Round) -> None:
        depth, accepted = drafted_depth(round.draft), round.verdict.num_accepted
        target = torch.where(accepted >= depth, accepted + 1, accepted).double()
        eta = torch.where(target > self.gamma, self.up, self.down)
        moved = ((1 - eta) * self.gamma + eta * target).clamp(self.min_len, self.max_len)
        self.gamma = torch.where(depth > 0, moved, self.gamma)

    def select_rows(self, rows: torch.Tensor) -> None:
        if self.gamma is not None:
            self.gamma = self.gamma[rows]


@register("policy", "gammatune_plus")
class GammaTunePlus(GammaTune):
    """GammaTune+ : :class:`GammaTune` with its confidence gate on (``threshold = 0.4``, transformers' default
    ``assistant_confidence_threshold``). Same faithfulness: a reconstruction (``policies.md`` section 2)."""

    def __init__(
        self,
        initial: float | None = None,
        up: float = 0.5,
        down: float = 0.25,
        min_len: int = 1,
        max_len: int = 16,
        threshold: float = 0.4,
        nodes_per_depth: int = 1,
        width: int | None = None,
    ) -> None:
        super().__init__(initial, up, down, min_len, max_len, threshold, nodes_per_depth, width)
