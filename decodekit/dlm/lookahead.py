"""Drafted walks across a block boundary: a row that finishes its block on a drafted canvas takes the next block's
first step on that canvas's output, without a forward of its own.

Without it, each block after the first costs a forward for its first step alone: the drafts of the block before stop
at its last step, since a finished canvas needs no step of that block. When every masked slot a row has left fits in
one drafted canvas (the draft strategy's ``finishes``), a schedule that names the next block (``next_block``) and a
cache that can compute it on each canvas (``lookahead = True``: :class:`~decodekit.dlm.caches.Recompute`, which
predicts every slot anyway, and :class:`~decodekit.dlm.caches.BlockCausalCache`, which then runs the next block, still
masked, after each copy of the current one) let the loop set ``state.lookahead``: the drafts may then finish the
block, and the forward also gives the next block's logits on each canvas. When a row's steps end its block on such a
canvas, those logits are what the undrafted sampler's first step of the next block computes (the same canvas, the
same positions and mask), so the row takes that step on them: still lossless, one forward fewer a block.
"""

from __future__ import annotations

from typing import Any

import torch

from decodekit.dlm.state import DLMState, SlotLogits, output_at, restrict


def lookahead_block(parts: Any, state: DLMState, left: list[int]) -> tuple[int, int] | None:
    """The next block, if the next forward's drafts may finish the current block in some row (``left``: each row's
    masked slots in it, host ints) and the schedule, the cache and the draft strategy all declared they support
    looking ahead (``parts.declared.lookahead``); else None."""
    if not parts.declared.lookahead:
        return None
    return parts.schedule.next_block(state) if parts.draft.finishes(min(k for k in left if k > 0)) else None


class NextBlock:
    """Each row's logits for the first step of the next block, kept from the lookahead forward in which the row
    finished its block on a drafted canvas; taken when that block starts."""

    def __init__(self) -> None:
        self.logits: torch.Tensor | None = None  # [B, W, V] (a window from slot `lo`) or [B, G, V]
        self.lo: int | None = None  # the window's first slot; None: dense
        self.kept: list[bool] = []

    def keep(self, state: DLMState, outputs: torch.Tensor | SlotLogits, node: torch.Tensor, rows: list[bool]) -> None:
        """For the ``rows`` (host bools) whose step just finished their block on canvas ``node[b]`` of this
        lookahead forward's ``outputs``, keep that canvas's logits of the next block (``state.lookahead``)."""
        if not any(rows):
            return
        picked = restrict(output_at(outputs, node), *state.lookahead)
        tensor, self.lo = (picked.logits, picked.lo) if isinstance(picked, SlotLogits) else (picked, None)
        if self.logits is None:
            # zeros: a row without kept logits has no proposals there (its drafts commit nothing)
            self.logits, self.kept = torch.zeros_like(tensor), [False] * state.batch_size
        chosen = torch.tensor(rows, device=tensor.device)
        self.logits[chosen] = tensor[chosen]
        self.kept = [k or r for k, r in zip(self.kept, rows)]

    def take(self, left: list[int], own_steps: bool) -> tuple[torch.Tensor | SlotLogits, list[bool]] | None:
        """At a block's start (``left``: each row's masked slots in it): the logits of its first step and the rows
        that take it now, the others waiting for the block's first forward; each row that kept logits with a rule
        of ``per_row_steps``, else every row or none. None when no row takes it; forgets what was kept."""
        logits, kept, lo = self.logits, self.kept, self.lo
        self.logits, self.kept = None, []
        if logits is None:
            return None
        live = [k and n > 0 for k, n in zip(kept, left)] if own_steps else [all(kept)] * len(kept)
        if not any(live):
            return None
        return (logits if lo is None else SlotLogits(logits, lo)), live
