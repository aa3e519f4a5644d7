"""Counters and timings of a generation run. Names follow vLLM's speculative-decoding metrics.

Definitions (per live row and round; a *draft* is a row-round that proposed at least one token):

* ``mean_acceptance_length = 1 + accepted / num_drafts`` (vLLM; counts the bonus/correction token; 1.0 for AR).
* ``acceptance_rate_per_pos[j] = accepted_per_pos[j] / drafted_per_pos[j]``: how often draft position ``j`` was
  accepted when it was proposed (unconditional on earlier positions, as vLLM reports it).
* ``tokens_per_step``: tokens committed per row per target forward after prefill (Spec-Bench's tau; 1.0 for AR).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any

import torch


@dataclass
class SpecStats:
    """Counters and timings of one :func:`decodekit.generate` call (summed over rows and rounds)."""

    num_rows: int = 0
    rounds: int = 0
    row_steps: int = 0
    num_drafts: int = 0
    drafted: int = 0
    accepted: int = 0
    generated: int = 0
    accepted_per_pos: list[int] = field(default_factory=list)
    drafted_per_pos: list[int] = field(default_factory=list)
    acceptance_histogram: list[int] = field(default_factory=list)
    prefill_time_s: float = 0.0
    draft_time_s: float = 0.0
    verify_time_s: float = 0.0
    total_time_s: float = 0.0

    # ------------------------------------------------------------------------------------------------ derived
    @property
    def mean_acceptance_length(self) -> float:
        return 1.0 + self.accepted / self.num_drafts if self.num_drafts else 1.0

    @property
    def draft_acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def acceptance_rate_per_pos(self) -> list[float]:
        return [a / d if d else 0.0 for a, d in zip(self.accepted_per_pos, self.drafted_per_pos)]

    @property
    def tokens_per_step(self) -> float:
        return (self.generated - self.num_rows) / self.row_steps if self.row_steps else 0.0

    @property
    def decode_time_s(self) -> float:
        return self.total_time_s - self.prefill_time_s

    @property
    def other_time_s(self) -> float:
        """Decode time spent outside drafting and verification (bookkeeping, streaming)."""
        return self.decode_time_s - self.draft_time_s - self.verify_time_s

    # --------------------------------------------------------------------------------------------- recording
    def record_round(self, drafted: torch.Tensor, accepted: torch.Tensor, committed: torch.Tensor) -> None:
        """Add one round: per live row, tokens ``drafted [B]``, ``accepted [B]`` and ``committed [B]`` (CPU)."""
        self.rounds += 1
        self.row_steps += drafted.numel()
        self.generated += int(committed.sum())
        width = int(drafted.max()) if drafted.numel() else 0
        if width == 0:
            return
        self.num_drafts += int((drafted > 0).sum())
        self.drafted += int(drafted.sum())
        self.accepted += int(accepted.sum())
        _grow(self.drafted_per_pos, width)
        _grow(self.accepted_per_pos, width)
        _grow(self.acceptance_histogram, width + 1)
        for j in range(width):
            self.drafted_per_pos[j] += int((drafted > j).sum())
            self.accepted_per_pos[j] += int((accepted > j).sum())
        for a in accepted[drafted > 0].tolist():
            self.acceptance_histogram[a] += 1

    def merge(self, other: SpecStats) -> SpecStats:
        """Sum of two runs' counters and times (for aggregating over prompts or batches)."""
        out = SpecStats()
        for name, value in asdict(self).items():
            theirs = getattr(other, name)
            if isinstance(value, list):
                n = max(len(value), len(theirs))
                setattr(out, name, [_at(value, i) + _at(theirs, i) for i in range(n)])
            else:
                setattr(out, name, value + theirs)
        return out

    def to_dict(self) -> dict[str, Any]:
        """All counters plus the derived metrics, JSON-ready."""
        out = asdict(self)
        for name in (
            "mean_acceptance_length",
            "draft_acceptance_rate",
            "acceptance_rate_per_pos",
            "tokens_per_step",
            "decode_time_s",
            "other_time_s",
        ):
            out[name] = getattr(self, name)
        return out


def _grow(values: list[int], n: int) -> None:
    values.extend([0] * (n - len(values)))


def _at(values: list[int], i: int) -> int:
    return values[i] if i < len(values) else 0


class timed:
    """Context manager adding the block's wall time to ``stats.<name>``; synchronizes CUDA around the block.

    A class rather than ``@contextmanager``: it runs twice per round, so its own cost matters on tiny models.
    """

    __slots__ = ("stats", "name", "device", "start")

    def __init__(self, stats: SpecStats, name: str, device: torch.device) -> None:
        self.stats, self.name, self.device = stats, name, device if device.type == "cuda" else None

    def __enter__(self) -> None:
        if self.device is not None:
            torch.cuda.synchronize(self.device)
        self.start = time.perf_counter()

    def __exit__(self, *exc: object) -> None:
        if self.device is not None:
            torch.cuda.synchronize(self.device)
        setattr(self.stats, self.name, getattr(self.stats, self.name) + time.perf_counter() - self.start)
