"""GammaTune / GammaTune+ (Gautam, Shrestha, Reddy 2025): a draft length that jumps up while drafts pass and falls
back to a smoothed history at the first miss; GammaTune+ also stops a draft early when the drafter grows unsure."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from decodekit.checks import check_float, check_int
from decodekit.errors import ConfigError
from decodekit.policies.confidence import ConfidenceStop
from decodekit.policies.lengths import check_tree_args, drafted_depth, length_budget
from decodekit.registry import preset, register
from decodekit.spec.state import DecodeState
from decodekit.types import DraftBudget

if TYPE_CHECKING:
    from decodekit.spec.round import Round


@register("policy", "gammatune")
class GammaTune:
    """GammaTune's acceptance-driven length (Gautam, Shrestha, Reddy 2025, arXiv 2504.00030).

    Per row a length ``k`` and a smoothed length ``g`` (both start at ``initial``). After a round that accepted
    ``a`` tokens of a draft of depth ``d``, a switch between two regimes:

    * all ``d`` passed: jump, ``k <- min(a + jump, max_len)``, ``g`` unchanged;
    * otherwise: smooth, ``g <- clip((1 - eta) g + eta a, min_len, max_len)`` and ``k <- ceil(g)``.

    So a row lengthens at once while drafts keep passing and falls back to its smoothed history at the first miss
    (rows that drafted nothing keep both). ``threshold`` adds GammaTune+'s confidence gate: a step-wise drafter stops
    after a token where its top-1 probability is below ``threshold`` (the token is kept); ``k`` then caps the round.
    Registered as ``gammatune_plus`` (:class:`GammaTunePlus`).

    Faithfulness: **a reconstruction from a secondary source.** The paper's text could not be read; the switch above
    and its constants (``eta = 0.3``, ``jump = 2``, ``k`` in ``[1, 10]``, start 3) follow one public
    reimplementation's account of the paper's algorithm, which agrees with the abstract ("heuristic-based switching
    mechanism", training-free) but could not be checked against the paper. GammaTune+'s threshold value was not
    found; 0.4 is transformers' ``assistant_confidence_threshold``.

    Works for chains and tree budgets (``nodes_per_depth``: ``k`` is the depth, ``d`` the deepest drafted node).
    Host syncs: one per round, the batch's longest ``k`` (:func:`~decodekit.policies.lengths.length_budget`), so
    a draft model runs as many steps as the longest row needs rather than ``max_len``.

    Args:
        initial: ``k`` and ``g`` at the start of each call (None = 3, within the bounds).
        eta: the smoothing gain of a round with a rejection, in ``(0, 1]``.
        jump: how far past the accepted length a fully accepted round moves ``k``.
        min_len, max_len: bounds of the drafted length.
        threshold: None, or GammaTune+'s confidence gate (a probability).
        nodes_per_depth, width: tree budgets (:func:`~decodekit.policies.lengths.length_budget`).
    """

    def __init__(
        self,
        initial: float | None = None,
        eta: float = 0.3,
        jump: int = 2,
        min_len: int = 1,
        max_len: int = 10,
        threshold: float | None = None,
        nodes_per_depth: int = 1,
        width: int | None = None,
    ) -> None:
        self.min_len = check_int("min_len", min_len, low=1, hint=" (a row at length 0 would never draft again)")
        self.max_len = check_int("max_len", max_len, low=1)
        default = float(min(max(3, self.min_len), self.max_len))
        self.initial = default if initial is None else check_float("initial", initial, low=0.0)
        if not self.min_len <= self.initial <= self.max_len:
            raise ConfigError(f"need min_len <= initial <= max_len, got {min_len}, {self.initial}, {max_len}")
        self.eta = check_float("eta", eta, low=0.0, high=1.0, low_open=True, hint=" (the smoothing gain)")
        self.jump = check_int("jump", jump, low=0, hint=" (tokens past a fully accepted draft)")
        self.gate = None if threshold is None else ConfidenceStop(threshold, self.max_len)
        self.threshold = None if self.gate is None else self.gate.threshold
        self.nodes_per_depth, self.width = check_tree_args(nodes_per_depth, width)
        self.k: torch.Tensor | None = None  # [B] long, the next round's length
        self.smoothed: torch.Tensor | None = None  # [B] float64, g

    def begin(self, state: DecodeState) -> None:
        self.smoothed = torch.full(state.lengths.shape, self.initial, dtype=torch.float64, device=state.device)
        self.k = self.smoothed.ceil().long()

    def plan(self, state: DecodeState) -> DraftBudget:
        if self.k is None or self.k.shape[0] != state.batch_size:
            self.begin(state)
        stop = None if self.gate is None else self.gate.stop_top1
        return length_budget(self.k.clone(), None, self.nodes_per_depth, self.width, stop)

    def observe(self, state: DecodeState, round: Round) -> None:
        depth, accepted = drafted_depth(round.draft), round.verdict.num_accepted
        drew, full = depth > 0, accepted >= depth
        smoothed = ((1 - self.eta) * self.smoothed + self.eta * accepted).clamp(self.min_len, self.max_len)
        self.smoothed = torch.where(drew & ~full, smoothed, self.smoothed)
        k = torch.where(full, (accepted + self.jump).clamp(self.min_len, self.max_len), self.smoothed.ceil().long())
        self.k = torch.where(drew, k, self.k)

    def select_rows(self, rows: torch.Tensor) -> None:
        if self.k is not None and self.smoothed is not None:
            self.k, self.smoothed = self.k[rows], self.smoothed[rows]


GammaTunePlus = preset(
    "policy", "gammatune_plus", GammaTune, public="GammaTunePlus", module=__name__, threshold=0.4,
    doc="""GammaTune+: :class:`GammaTune` with its confidence gate on (``threshold = 0.4``, transformers' default
    ``assistant_confidence_threshold``; the paper's value was not found). Same faithfulness: a reconstruction. A
    preset (:func:`decodekit.registry.preset`): it builds a ``GammaTune``.""",
)  # fmt: skip
