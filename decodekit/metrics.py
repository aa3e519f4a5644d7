"""Counters and timings of a generation run. Names follow vLLM's speculative-decoding metrics.

Definitions (per live row and round; a *draft* is a row-round that proposed at least one token; *accepted* counts
the accepted draft tokens the round committed, none past an end of sequence, a stop string or the row's limit):

* ``mean_acceptance_length = 1 + accepted / num_drafts`` (vLLM; counts the bonus/correction token; 1.0 for AR).
* ``acceptance_rate_per_pos[j] = accepted_per_pos[j] / drafted_per_pos[j]``: how often draft position ``j`` was
  accepted when it was proposed (unconditional on earlier positions, as vLLM reports it). A position is a depth:
  a tree drafted position ``j`` when some valid node sits at depth ``j + 1`` (``drafted`` counts all its nodes, so
  ``draft_acceptance_rate`` of a tree is accepted tokens over all nodes drafted).
* ``tokens_per_step``: tokens committed per row per target forward after prefill (Spec-Bench's tau; 1.0 for AR).
"""

from __future__ import annotations

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
    round_max_accepted: list[int] = field(default_factory=list)
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
    def rejected_per_token(self) -> float:
        """Drafted-but-rejected tokens per token committed after prefill (wasted draft and verify work)."""
        tokens = self.generated - self.num_rows
        return (self.drafted - self.accepted) / tokens if tokens > 0 else 0.0

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
            "rejected_per_token",
            "decode_time_s",
            "other_time_s",
        ):
            out[name] = getattr(self, name)
        return out


def _at(values: list[int], i: int) -> int:
    return values[i] if i < len(values) else 0


class RoundCounters:
    """The per-round counters of :class:`SpecStats`, accumulated on the device: recording a round costs no host
    sync; :meth:`flush` reads them once at the end of the call."""

    def __init__(self, device: torch.device) -> None:
        self.rounds = 0
        self.row_steps = 0
        self.sums = torch.zeros(3, dtype=torch.long, device=device)  # num_drafts, drafted, accepted
        self.per_pos = torch.zeros(2, 0, dtype=torch.long, device=device)  # drafted_per_pos, accepted_per_pos
        self.histogram = torch.zeros(1, dtype=torch.long, device=device)
        self.round_max = torch.zeros(1, dtype=torch.long, device=device)  # rounds that drafted, by most accepted

    def add_round(
        self, drafted: torch.Tensor, accepted: torch.Tensor, width: int, reach: torch.Tensor | None = None
    ) -> None:
        """One round: per live row, valid draft nodes ``drafted [B]``, the deepest valid node's depth ``reach [B]``
        (None: a chain's, ``drafted``) and ``accepted [B]``; ``width`` (host) bounds both (0: an autoregressive
        round, which costs no tensor op here)."""
        self.rounds += 1
        self.row_steps += drafted.numel()
        if width == 0:
            return
        drew = drafted > 0
        self.sums += torch.stack([drew.sum(), drafted.sum(), (accepted * drew).sum()])
        if self.per_pos.shape[1] < width:
            grow = width - self.per_pos.shape[1]
            self.per_pos = torch.cat([self.per_pos, self.per_pos.new_zeros(2, grow)], 1)
            self.histogram = torch.cat([self.histogram, self.histogram.new_zeros(grow)])
            self.round_max = torch.cat([self.round_max, self.round_max.new_zeros(grow)])
        ar = torch.arange(width, device=drafted.device)
        reach = drafted if reach is None else reach
        self.per_pos[:, :width] += torch.stack([(reach[:, None] > ar).sum(0), (accepted[:, None] > ar).sum(0)])
        self.histogram.scatter_add_(0, accepted.clamp(0, width), drew.long())
        self.round_max.scatter_add_(0, (accepted * drew).max().clamp(0, width)[None], drew.any().long()[None])

    def flush(self, stats: SpecStats, generated: int) -> None:
        """Write the counters and the number of ``generated`` tokens into ``stats`` (host reads at the end)."""
        sums, per_pos = self.sums.tolist(), self.per_pos.tolist()
        histogram, round_max = torch.stack([self.histogram, self.round_max]).tolist()  # one read for both
        used = max((j + 1 for j, d in enumerate(per_pos[0]) if d), default=0)
        stats.rounds, stats.row_steps = self.rounds, self.row_steps
        stats.generated = generated
        stats.num_drafts, stats.drafted, stats.accepted = sums
        stats.drafted_per_pos, stats.accepted_per_pos = per_pos[0][:used], per_pos[1][:used]
        stats.acceptance_histogram = histogram[: used + 1] if used else []
        stats.round_max_accepted = round_max[: used + 1] if used else []


@dataclass
class DLMStats:
    """Counters and timings of one :func:`decodekit.dlm.generate` call.

    Attributes:
        nfe: model forwards (a classifier-free-guidance forward of the conditional and unconditional batch counts
            once, as in Fast-dLLM's counts; so does a forward of the canvas with its drafted canvases).
        row_nfe: per row, the forwards in which it still had masked slots in its block.
        tokens: generated tokens (rows times ``gen_length``).
        block_steps: per block, the steps it took (its slowest row's; more than its forwards with a draft strategy).
        row_block_steps: per block, each row's steps in it (0 for a block an end-of-text rule filled before it began).
        cache_forwards: forwards a cache strategy ran besides the steps' own (its optional ``forwards`` count; not in
            ``nfe``; none of the built-in strategies runs any: the block-causal cache stores a finished block in the
            next step's forward).
        wall_time_s: wall time of the call.
    """

    nfe: int = 0
    cache_forwards: int = 0
    row_nfe: list[int] = field(default_factory=list)
    tokens: int = 0
    block_steps: list[int] = field(default_factory=list)
    row_block_steps: list[list[int]] = field(default_factory=list)
    wall_time_s: float = 0.0

    @property
    def tokens_per_forward(self) -> float:
        """Generated tokens per row per forward that row took part in (DiffusionGemma's metric; 1.0 = one token
        per step)."""
        return self.tokens / max(sum(self.row_nfe), 1)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.wall_time_s if self.wall_time_s > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "tokens_per_forward": self.tokens_per_forward, "tokens_per_s": self.tokens_per_s}
