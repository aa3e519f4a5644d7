"""Early-exit self-speculation (LayerSkip, Elhoushi et al., ACL'24, arXiv 2404.16710; Draft & Verify, Zhang et al.,
ACL'24): the target drafts with its own first ``L`` layers and its own final norm and output head, in its own KV
cache.

Draft step ``j`` runs one token through layers ``1..L`` at position ``c + j`` (``c``: the row's committed length;
step 0 runs the pending token), staged in the target's :class:`~decodekit.cache.KVCache` at offset ``j``. The
verification forward then stages ``[pending] + draft`` at offset 0 and overwrites those slots in every layer, so
nothing the drafter wrote survives into the committed cache and the output is exactly the target's. There is no
second model and no second cache; a draft step costs ``L / N`` of a target step.

Faithfulness: LayerSkip's self-speculative decoding without its training recipe (layer dropout and an early-exit
loss, which make shallow exits agree with the last layer) and without its reuse of the draft's first-``L``-layer
K/V entries in verification (here verification recomputes them). The exit is the target's own ``head(norm(h_L))``
untrained, as transformers' ``assistant_early_exit``: on a model not trained for early exit, shallow layers agree
with the last one rarely. Kangaroo's trained adapter is not built yet (DEL's per-context exit choice is
:class:`~decodekit.drafters.DynamicExitDrafter`). Chains only. Lossless with every lossless verifier (sampled
drafts carry ``q``).
"""

from __future__ import annotations

from typing import Any

import torch

from decodekit.budget import DraftBudget
from decodekit.cache import KVCache
from decodekit.checks import check_float, check_int
from decodekit.draft import Draft
from decodekit.drafters.chain import SamplesLikeTheTarget, draft_chain
from decodekit.errors import ConfigError
from decodekit.masks import chain_mask
from decodekit.models.base import LanguageModel
from decodekit.registry import register
from decodekit.state import DecodeState


@register("drafter", "early_exit")
class EarlyExitDrafter(SamplesLikeTheTarget):
    """Draft with the target's first ``exit_layer`` layers and its own head, in the target's KV cache.

    Args:
        exit_layer: layers that draft, ``1 <= L < num_layers`` of the target (checked in ``begin``); None = half.
        temperature: the drafter's sampling temperature; None = the call's.
    """

    shares_target = True

    def __init__(self, exit_layer: int | None = None, temperature: float | None = None) -> None:
        self.exit_layer = check_int("exit_layer", exit_layer, low=1, optional=True, hint=" (None = half the layers)")
        self.temperature = check_float("temperature", temperature, low=0, optional=True, hint=" (None = the call's)")

    def begin(self, state: DecodeState, target: LanguageModel, cache: KVCache) -> None:
        layers = target.num_layers
        self.layers = layers // 2 if self.exit_layer is None else self.exit_layer
        if not 1 <= self.layers < layers:
            raise ConfigError(
                f"exit_layer={self.layers} must be below the target's {layers} layers (drafting with all of them "
                f"costs a full target step per token); pick 1..{layers - 1}"
            )
        self.target, self.cache = target, cache

    def layer_args(self) -> dict[str, Any]:
        """Which layers draft: ``target.forward``'s ``exit_layer`` (a subclass may skip layers instead)."""
        return {"exit_layer": self.layers}

    def _step(self, x: torch.Tensor, offset: int, hidden: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Run ``x [B]`` at each row's position ``c + offset`` through the first layers -> (``[B, V]``, ``[B, H]``)."""
        kv_len = self.cache.stage(1, offset=offset)
        mask, positions = chain_mask(self.cache.lengths + offset, 1, kv_len)
        out = self.target.forward(x[:, None], positions, mask, self.cache, return_hidden=hidden, **self.layer_args())
        return out.logits[:, -1], (out.last_hidden[:, -1] if hidden else None)

    def propose(self, state: DecodeState, budget: DraftBudget) -> Draft:
        """``budget.max_len`` early-exit steps (the first on the pending token); host syncs only for a stop rule."""
        if budget.max_len == 0:
            return Draft.empty(state.batch_size, state.device)
        hidden = budget.stop is not None and bool(getattr(budget.stop, "needs_hidden", False))
        logits, h = self._step(state.pending, 0, hidden)
        offset = iter(range(1, budget.max_len))
        return draft_chain(
            state, budget, self.sampling(state.sampling), logits, h, lambda x: self._step(x, next(offset), hidden)
        )
