"""Fast-dLLM's dual cache: K/V of the whole canvas, the block's rows rewritten each step."""

from __future__ import annotations

import torch

from decodekit.dlm.caches.base import RefreshedCache, full_forward_kept, refreshes, rewrite_forward
from decodekit.dlm.model import DLMModel
from decodekit.dlm.state import DLMState, SlotLogits
from decodekit.registry import register


@register("dlm_cache", "dual")
class DualCache(RefreshedCache):
    """Each block's first step runs the whole canvas and keeps every position's K/V; its later steps run only the
    block's slots, overwriting their K/V in place, against the cached prefix and suffix (Wu et al. 2025,
    "Fast-dLLM", ``generate_with_dual_cache`` with ``replace_position``).

    **Approximate** for a bidirectional model: the prefix and the later blocks' masked suffix keep the K/V of the
    block's first step until the next block's refresh (exact for that first step). With ``shift_logits`` the fed
    slots start one position earlier (the block's first slot is predicted from the position before it). The refresh
    counts as a forward.

    Under an adaptive region schedule (AdaBlock, DCD's sliding window) each round's first step refreshes; later steps
    feed each row's slots from the first one masked at the refresh (everything before it committed) to its region's
    current end (:func:`~decodekit.dlm.caches.base.fed_logits`, one host read a step). Rows keep their own spans, so a
    row's output does not depend on its batch mates.

    Args:
        refresh: also recompute the canvas every ``refresh`` steps within a block (round); None = at its first step
            only (the reference). ``refresh=1`` is the uncached sampler exactly.

    Faithfulness: the reference scheme, token for token with the reference's own cached loop under the fixed schedule
    (``tests/unit/test_dlm_reference.py``, checked against NVlabs/Fast-dLLM ``llada/generate.py`` at
    f6b35ec3f1b16e1b3d3357938046559ae2d350fa); per-row ragged prompts and the adaptive-region form are ours.
    """

    to_region_end = True

    def logits(self, dlm: DLMModel, state: DLMState) -> torch.Tensor | SlotLogits:
        if state.region is not None:
            return self.adaptive.logits(dlm, state)
        if refreshes(state, self.refresh) or self.cache is None:
            logits, self.cache = full_forward_kept(dlm, state)
            return logits
        lo, hi = state.block
        shift = int(dlm.shift_logits)
        slots = state.starts[:, None] + torch.arange(lo - shift, hi - shift, device=state.device)
        return SlotLogits(rewrite_forward(dlm, self.cache, state, slots), lo)  # the block's slots only
