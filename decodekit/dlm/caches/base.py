"""The cache strategy contract and the exact baseline: recompute the whole canvas every step."""

from __future__ import annotations

import torch

from decodekit.cache import KVCache
from decodekit.dlm.model import DLMModel
from decodekit.dlm.state import DLMState
from decodekit.registry import register


def full_forward(dlm: DLMModel, state: DLMState) -> tuple[torch.Tensor, KVCache]:
    """The whole canvas, bidirectional: ``[B, G, V]`` logits and the staged cache (:meth:`DLMModel.forward`)."""
    return dlm.forward(state.canvas, state.lengths, state.starts, state.gen_length)


@register("dlm_cache", "recompute")
class Recompute:
    """No cache: every step recomputes the whole canvas (LLaDA's reference; exact). ``cache=None`` is this."""

    def logits(self, dlm: DLMModel, state: DLMState) -> torch.Tensor:
        """``[B, G, V]`` float32 logits of the generation region for this step."""
        return full_forward(dlm, state)[0]
