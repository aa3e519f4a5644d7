"""Fast-dLLM's prefix cache: K/V of everything before the block, refreshed once per block."""

from __future__ import annotations

import torch

from decodekit.dlm.caches.base import RefreshedCache, full_forward, refreshes
from decodekit.dlm.model import DLMModel
from decodekit.dlm.state import DLMState, SlotLogits
from decodekit.masks import bidirectional_mask, staged_layout
from decodekit.registry import register


@register("dlm_cache", "prefix")
class PrefixCache(RefreshedCache):
    """Each block's first step runs the whole canvas and keeps the K/V of the positions before the block; its later
    steps run only the block and everything after it (the later blocks' masks) against that prefix (Wu et al. 2025,
    "Fast-dLLM", ``generate_with_prefix_cache``).

    **Approximate** for a bidirectional model: the prefix K/V were computed while the block was still masked and are
    not updated by its commits until the next block's refresh (exact for the first step of every block). With
    ``shift_logits`` the prefix stops one position earlier, so the block's first slot is predicted from a fresh
    output. The refresh counts as a forward (as in the reference's NFE).

    Under an adaptive region schedule (AdaBlock, DCD's sliding window) each round's first step refreshes, and a row's
    frozen prefix ends at the first slot that was masked in its region then (everything before it is committed);
    later steps feed everything from there on (:func:`~decodekit.dlm.caches.base.fed_logits`, one host read a step).
    DCD's window only moves right, so the fed span keeps covering it. Rows keep their own prefixes, so a row's output
    does not depend on its batch mates.

    Args:
        refresh: also recompute the canvas every ``refresh`` steps within a block (round); None = at its first step
            only (the reference). DCD decodes the whole generation in one round, so without ``refresh`` its prefix
            is the prompt alone; ``refresh=1`` is the uncached sampler exactly.

    Faithfulness: the reference scheme (refresh at each block start, suffix of block + later masks fed each step,
    commits only in the block), token for token with the reference's own cached loop under the fixed schedule
    (``tests/unit/test_dlm_reference.py``, checked against NVlabs/Fast-dLLM ``llada/generate.py`` at
    f6b35ec3f1b16e1b3d3357938046559ae2d350fa); per-row ragged prompts and the adaptive-region form are ours.
    """

    def logits(self, dlm: DLMModel, state: DLMState) -> torch.Tensor | SlotLogits:
        if state.region is not None:
            return self.adaptive.logits(dlm, state)
        shift = int(dlm.shift_logits)
        first = state.block[0] - shift  # the first fed slot (-1: the prompt's last token)
        if refreshes(state, self.refresh) or self.cache is None:
            logits, cache = full_forward(dlm, state)
            cache.keep(state.starts + first, host_counts=[s + first for s in state.host_starts])
            self.cache = cache
            return logits
        fed = state.gen_length - first
        tokens = state.canvas.gather(1, state.starts[:, None] + first + torch.arange(fed, device=state.device))
        view = self.cache.stage(fed)  # staged past the prefix, never kept: the next step writes there again
        mask, positions = bidirectional_mask(staged_layout(self.cache.lengths, fed, view.kv_len))
        width = state.gen_length - state.block[0]
        at = torch.arange(width, device=state.device).expand(state.batch_size, width)
        fresh = dlm.lm.forward(tokens, positions, mask, view, logits_at=at).logits.float()
        return SlotLogits(fresh, state.block[0])  # the block and everything after it
