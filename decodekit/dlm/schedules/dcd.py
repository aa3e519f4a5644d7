"""DCD: a confidence-aware sliding window instead of blocks (deferred commitment)."""

from __future__ import annotations

from collections.abc import Iterator

import torch

from decodekit.checks import check_int
from decodekit.dlm.model import DLMModel
from decodekit.dlm.schedules.common import next_rounds
from decodekit.dlm.state import DLMState, Proposal
from decodekit.registry import register


@register("dlm_schedule", "dcd")
class DeferredWindow:
    """A window that slides instead of fixed blocks (DCD, arXiv 2601.02076, "deferred commitment decoding"): every
    step a row's region starts at its leftmost masked slot ``L`` and extends right while it holds at most ``size``
    slots and at most ``max_masked`` masked ones. A slot near a would-be block boundary is thus never forced out
    before the slots to its right are visible in the region: uncertain slots are deferred, the window moves on as the
    left end commits. Pair it with a threshold rule (commit ``>= tau``, else the row's most confident slot): the
    paper's rule.

    Faithfulness: a **reconstruction** from the paper's description (the window bounds and the cap on masks in it;
    no reference code was available); rows slide independently. Cache strategies: ``None`` (recompute), ``dkv``, and
    ``prefix`` / ``dual`` (the paper pairs DCD with both): the whole generation is one round, so give those a
    ``refresh`` interval (``PrefixCache(refresh=8)``), else they refresh only at the first step.

    Args:
        size: ``s_max``, the most slots in the window; None = ``block_length``.
        max_masked: the most masked slots in the window; None = ``size`` (no extra cap).
    """

    fixed_blocks = False
    slides = True  # the loop re-slides the window after each commit, so a row stays live while it has masked slots

    def __init__(self, size: int | None = None, max_masked: int | None = None) -> None:
        self.size = check_int("size", size, low=1, optional=True)
        self.max_masked = check_int("max_masked", max_masked, low=1, optional=True)

    def rounds(self, dlm: DLMModel, state: DLMState) -> Iterator[None]:
        yield from next_rounds(state, lambda: torch.zeros(state.batch_size, dtype=torch.long, device=state.device))

    def region(self, state: DLMState, proposal: Proposal) -> torch.Tensor:
        """``[B, G]``: each row's window this step."""
        size = self.size or state.block_length
        cap = self.max_masked or size
        masked = state.masked
        j = torch.arange(state.gen_length, device=state.device)
        left = torch.where(masked.any(1), masked.float().argmax(1), state.gen_length)[:, None]
        inside = (j >= left) & (j < left + size)
        state.region = inside & ((masked & inside).long().cumsum(1) <= cap)
        return state.region
