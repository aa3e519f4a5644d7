"""A draft model's token tree, staged level by level in its own KV cache (shared by the tree drafters built on
:class:`~decodekit.drafters.ModelDrafter`).

Shapes: ``B`` rows, ``F`` parents expanded at a level, ``M`` nodes of a level, ``T`` staged tree slots, ``V``
vocabulary.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from decodekit.masks import tree_mask
from decodekit.processors import process_next
from decodekit.state import DecodeState

if TYPE_CHECKING:
    from decodekit.drafters.model import ModelDrafter


class StagedTree:
    """One round's tree in the draft cache: node ``t`` of the staged block sits at slot ``L_b + t`` (``L_b`` = the
    committed length, pending token included) and attends to the committed prefix, its ancestors and itself."""

    def __init__(self, drafter: ModelDrafter, batch: int, device: torch.device) -> None:
        self.drafter = drafter
        self.ancestors = torch.zeros(batch, 0, 0, dtype=torch.bool, device=device)  # [B, T, T] over staged slots

    def forward(self, tokens: torch.Tensor, parent_slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Stage ``tokens [B, M]`` (one tree level) under the nodes at ``parent_slots [B, M]`` (-1 = the pending
        token) and run them in one forward. Returns their logits ``[B, M, V]`` and slots ``[B, M]``."""
        off, (batch, m) = self.ancestors.shape[1], tokens.shape
        anc = torch.zeros(batch, off + m, off + m, dtype=torch.bool, device=tokens.device)
        anc[:, :off, :off] = self.ancestors
        if off:
            rows = self.ancestors.gather(1, parent_slots.clamp(min=0)[..., None].expand(-1, -1, off))
            anc[:, off:, :off] = rows & (parent_slots >= 0)[..., None]
        anc[:, off:, off:] = torch.eye(m, dtype=torch.bool, device=tokens.device)
        cache = self.drafter.cache
        kv_len = cache.stage(m, offset=off)
        mask, positions = tree_mask(cache.lengths, anc, kv_len)
        logits = self.drafter.model.forward(tokens, positions[:, off:], mask[:, :, off:], cache).logits
        self.ancestors = anc
        slots = torch.arange(off, off + m, device=tokens.device).expand(batch, m)
        return logits, slots


def process_paths(state: DecodeState, logits: torch.Tensor, paths: torch.Tensor) -> torch.Tensor:
    """The call's logits processors on ``logits [B, F, V]`` after each parent's path ``paths [B, F, d]``."""
    if state.processing is None:
        return logits
    drafted = [paths[:, f] if paths.shape[2] else None for f in range(logits.shape[1])]
    return torch.stack([process_next(state, logits[:, f], drafted[f]) for f in range(logits.shape[1])], 1)
