"""DecodeState: the live rows of a :func:`decodekit.generate` call, as drafters and policies see them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from decodekit.models.prompts import pad_rows
from decodekit.sampling import RowGenerators
from decodekit.types import SamplingParams

if TYPE_CHECKING:
    from decodekit.draft import Draft
    from decodekit.spec.processors import LogitsProcessing


@dataclass
class DecodeState:
    """Per-row token history of the rows still generating.

    Each row holds its prompt and everything generated so far; the last token is the *pending* token
    (sampled, not yet in the target's cache). Rows leave the batch when they finish, so index ``b`` of these
    tensors is not the caller's row: ``rows[b]`` is.

    Attributes:
        tokens: ``[B, C + 1]`` prompt + generated tokens, right-padded with 0 (the last column is scratch).
        lengths: ``[B]`` number of real tokens per row (the pending token is at ``lengths - 1``).
        prompt_lengths: ``[B]`` prompt length per row.
        max_lengths: ``[B]`` the length at which a row stops (prompt + max_new_tokens, capped by the context).
        rows: ``[B]`` index of each live row in the caller's batch.
        pending: ``[B]`` the pending token of each row (``tokens[b, lengths[b] - 1]``).
        sampling: the sampling parameters of the call.
        generator: the call's randomness: a ``torch.Generator`` (an int seed),
            :class:`~decodekit.sampling.RowGenerators` (one seed per row; draw through
            :func:`~decodekit.sampling.sample` with a key), or None (torch's global generator).
        host_lengths: ``lengths`` as a host list, refreshed by the loop's one read per round: use it instead of
            reading ``lengths`` (each read of a device tensor is a host sync a GPU user pays for).
        host_max_lengths: ``max_lengths`` as a host list.
        needs: what the call's components asked the round record for (drafters that report optional data, such
            as ``Draft.draft_probs`` for "kl", can skip it when nobody asked).
        processing: the call's logits processors (``repetition_penalty``, ``logits_processor=...``), or None. A
            drafter that samples from a model's distribution passes its logits through
            :func:`decodekit.spec.processors.process_next` so that it drafts from what the target will verify against.
        vocab_size: the target's vocabulary size (token ids in ``[0, vocab_size)``), or None when unknown; a drafter
            with tables over token ids (suffix tries, Token Recycling's successors) resets them when it changes.
    """

    tokens: torch.Tensor
    lengths: torch.Tensor
    prompt_lengths: torch.Tensor
    max_lengths: torch.Tensor
    rows: torch.Tensor
    pending: torch.Tensor
    sampling: SamplingParams
    generator: torch.Generator | RowGenerators | None = None
    host_lengths: list[int] = field(default_factory=list)
    host_max_lengths: list[int] = field(default_factory=list)
    needs: frozenset[str] = frozenset()
    processing: LogitsProcessing | None = None
    vocab_size: int | None = None

    @classmethod
    def from_prompts(
        cls,
        prompts: list[list[int]],
        max_lengths: list[int],
        sampling: SamplingParams,
        generator: torch.Generator | RowGenerators | None,
        device: torch.device,
    ) -> DecodeState:
        """Right-pad ``prompts`` into a state with room for ``max_lengths`` tokens per row."""
        tokens, lengths = pad_rows(prompts, max(max_lengths) + 1)
        return cls(
            tokens=tokens.to(device),
            lengths=lengths.to(device),
            prompt_lengths=lengths.to(device),
            max_lengths=torch.tensor(max_lengths, dtype=torch.long, device=device),
            rows=torch.arange(len(prompts), device=device),
            pending=tokens.gather(1, (lengths - 1)[:, None])[:, 0].to(device),
            sampling=sampling,
            generator=generator,
            host_lengths=[len(p) for p in prompts],
            host_max_lengths=list(max_lengths),
        )

    @property
    def batch_size(self) -> int:
        return self.lengths.shape[0]

    @property
    def device(self) -> torch.device:
        return self.tokens.device

    @property
    def remaining(self) -> torch.Tensor:
        """``[B]`` how many more tokens each row may generate."""
        return self.max_lengths - self.lengths

    def append(self, new_tokens: torch.Tensor, counts: torch.Tensor) -> None:
        """Append ``new_tokens [B, M]``, of which row ``b`` uses the first ``counts[b]`` (must fit max_lengths)."""
        if new_tokens.shape[1] == 1:  # one token per row (plain decoding): counts are 0 or 1
            self.tokens.scatter_(1, self.lengths[:, None], new_tokens)
            self.lengths = self.lengths + counts
            self.pending = torch.where(counts > 0, new_tokens[:, 0], self.pending)
            return
        offsets = torch.arange(new_tokens.shape[1], device=self.device)
        slots = torch.where(offsets < counts[:, None], self.lengths[:, None] + offsets, self.tokens.shape[1] - 1)
        self.tokens.scatter_(1, slots, new_tokens)  # writes past a row's count land in the scratch column
        self.lengths = self.lengths + counts
        self.pending = self.tokens.gather(1, (self.lengths - 1)[:, None])[:, 0]

    def select_rows(self, rows: torch.Tensor, host_rows: list[int] | None = None) -> None:
        """Keep only ``rows [B']`` (indices into the current batch; ``host_rows``: the same on the host, which
        spares a host sync). Per-row generators keep the same rows."""
        for name in ("tokens", "lengths", "prompt_lengths", "max_lengths", "rows", "pending"):
            setattr(self, name, getattr(self, name)[rows])
        host_rows = rows.tolist() if host_rows is None else host_rows
        self.host_lengths = [self.host_lengths[b] for b in host_rows]
        self.host_max_lengths = [self.host_max_lengths[b] for b in host_rows]
        if isinstance(self.generator, RowGenerators):
            self.generator.select_rows(host_rows)

    def stamp(self, draft: Draft | None = None) -> tuple[tuple[int, int], ...]:
        """Each of the loop's tensors (and ``draft``'s tokens, parents and valid) as ``(id, version)``: a component
        that writes one in place, or replaces it, changes its stamp (host ints, no sync;
        :func:`~decodekit.spec.component_checks.check_untouched`)."""
        tensors = [self.tokens, self.lengths, self.prompt_lengths, self.max_lengths, self.pending]
        if draft is not None:
            tensors += [draft.tokens, draft.parents, draft.valid]
        return tuple((id(t), t._version) for t in tensors)

    @property
    def host_remaining(self) -> list[int]:
        """:attr:`remaining` as a host list (no sync)."""
        return [m - n for m, n in zip(self.host_max_lengths, self.host_lengths)]

    @property
    def host_room(self) -> int:
        """The most tokens any live row may still generate (host, no sync)."""
        return max(self.host_remaining, default=0)
