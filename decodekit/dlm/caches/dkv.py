"""dKV-Cache-Decode: a token's K/V is cached one step after it is decoded; everything undecoded is recomputed."""

from __future__ import annotations

import torch

from decodekit.checks import check_int
from decodekit.dlm.caches.base import DelayedCache, canvas_positions, fed_logits, full_forward_kept, with_predictors
from decodekit.dlm.model import DLMModel
from decodekit.dlm.state import DLMState
from decodekit.registry import register


@register("dlm_cache", "dkv")
class DKVCache(DelayedCache):
    """Delayed per-token caching (Ma et al. 2025, "dKV-Cache", the Decode variant).

    A token's K/V change sharply at the step it is decoded and little afterwards, while masked slots keep drifting.
    So a step feeds only the positions **not decoded as of the previous step** (every masked slot, in every block,
    plus the previous step's commits), each at its true position, and rewrites their K/V in place; every other
    position (the prompt, tokens decoded two or more steps ago) is read from the cache, holding the K/V of the last
    step that fed it. Steps 0 and 1 of every block and every ``refresh``-th step run the whole canvas (the
    reference's ``cache_reloading_step``); ``refresh=1`` is exact (every step a full forward). With
    ``shift_logits`` position ``p`` is also fed while slot ``p + 1`` is undecoded (it predicts that slot; dKV's
    ``shift_type='un'``).

    **Approximate**: cached K/V are those of an earlier step; the agreement with the uncached sampler is measured by
    ``python -m decodekit dlm-bench``. One extra host read per cached step (the widest row's fed count).

    Faithfulness: the reference's schedule (full forwards at block steps 0, 1 and multiples of the reload interval;
    the fed set = undecoded as of the previous step's input) over the shared :class:`~decodekit.cache.KVCache`
    ``write_at`` instead of its gather/scatter cache rebuild, token for token with the reference's own cache
    (``tests/unit/test_dlm_reference.py``, checked against horseee/dKV-Cache at
    49a76fcc43b744ec2d960137f216e419317138b1); ragged rows are ours. The Greedy variant (random
    decode order drawn per block, only the next step's slots and a window recomputed) is
    :class:`~decodekit.dlm.caches.DKVGreedyCache`.

    Args:
        refresh: run the whole canvas every ``refresh`` steps of a block (the reference's README uses 8, its scripts
            2-4).
    """

    def __init__(self, refresh: int = 4) -> None:
        super().__init__()  # before: [B, T] decoded at the previous step's input
        self.refresh = check_int("refresh", refresh, low=1)

    def logits(self, dlm: DLMModel, state: DLMState) -> torch.Tensor:
        """``[B, G, V]`` logits of every slot still masked (zeros elsewhere)."""
        position, real = canvas_positions(state)
        decoded = (state.canvas != state.mask_token_id) | (position < state.starts[:, None]) | ~real
        fed = ~self.before if self.before is not None else None
        self.before = decoded
        if state.step < 2 or state.step % self.refresh == 0 or self.cache is None:
            logits, self.cache = full_forward_kept(dlm, state)
            return logits
        if dlm.shift_logits:  # position p predicts slot p + 1: keep feeding it while p + 1 is undecoded
            fed = with_predictors(fed)
        return fed_logits(dlm, self.cache, state, fed & real)
