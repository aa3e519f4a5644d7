"""Value types shared by every component: sampling parameters, verdicts, outputs (drafts: :mod:`decodekit.draft`).

Shapes: ``B`` live rows, ``N`` draft nodes, ``V`` vocabulary size, ``D`` accepted path length.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from decodekit.budget import DraftBudget, DraftStep
from decodekit.draft import Draft, DraftKind
from decodekit.errors import ConfigError

if TYPE_CHECKING:
    from decodekit.metrics import SpecStats

__all__ = ["Draft", "DraftBudget", "DraftKind", "DraftStep", "GenerationOutput", "SamplingParams", "Verdict"]


@dataclass(frozen=True)
class SamplingParams:
    """Sampling applied to the target distribution (and, by default, to the drafter's).

    ``temperature == 0`` means greedy decoding. ``top_k`` / ``top_p`` are applied after temperature, in that
    order, as transformers does.
    """

    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ConfigError(f"temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if self.top_k is not None and self.top_k < 1:
            raise ConfigError(f"top_k must be a positive integer or None, got {self.top_k}")
        if self.top_p is not None and not 0.0 < self.top_p <= 1.0:
            raise ConfigError(f"top_p must be in (0, 1] or None, got {self.top_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass(frozen=True, eq=False)
class Verdict:
    """A verifier's decision for one round.

    Attributes:
        accepted: ``[B, D]`` accepted node indices along one root-to-leaf path, in order; ``-1`` pads.
        num_accepted: ``[B]`` length of that path (0 = every draft token rejected).
        next_token: ``[B]`` the new pending token: a correction (after a rejection) or a bonus token.
    """

    accepted: torch.Tensor
    num_accepted: torch.Tensor
    next_token: torch.Tensor


@dataclass(frozen=True)
class GenerationOutput:
    """Result of :func:`decodekit.generate`.

    Attributes:
        sequences: generated tokens per row (prompt excluded), stopped at EOS (included) or max_new_tokens.
        finish_reasons: per row, ``"eos"`` or ``"length"``.
        stats: counters and timings of the run.
    """

    sequences: list[list[int]]
    finish_reasons: list[str]
    stats: SpecStats = field(repr=False)
