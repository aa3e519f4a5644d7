"""dKV-Cache-Greedy: a step recomputes only the slots due next, the last step's commits and a window around them."""

from __future__ import annotations

import torch

from decodekit.checks import check_int
from decodekit.dlm.caches.base import DelayedCache, canvas_positions, fed_logits, full_forward_kept, with_predictors
from decodekit.dlm.model import DLMModel
from decodekit.dlm.state import DLMState
from decodekit.registry import register


@register("dlm_cache", "dkv_greedy")
class DKVGreedyCache(DelayedCache):
    """dKV-Cache's Greedy variant (Ma et al. 2025, "dKV-Cache"): with the decode order known in advance (random
    remasking drawn once per block, :class:`~decodekit.dlm.rules.RandomOrderRule`, which publishes
    ``state.planned``), a step feeds only

    * the slots it will commit (their logits are the only ones the rule reads),
    * the slots the previous step committed (their K/V move from the mask's to the token's),
    * ``window`` more masked slots around each due slot, nearest first, left before right (their K/V refreshed),
    * with ``shift_logits``, the position before each due slot (it predicts that slot),

    each at its true position, and rewrites their K/V in place; everything else, other masked slots included, is
    read as the cache holds it. Step 0 of every block and every ``refresh``-th step run the whole canvas. Far
    cheaper per step than :class:`~decodekit.dlm.caches.DKVCache` (a few positions instead of every masked one),
    and further from the uncached sampler.

    **Approximate**: ``refresh=1`` is exact (every step a full forward); otherwise the agreement with the uncached
    sampler (``RandomOrderRule`` without a cache) is measured by ``python -m decodekit dlm-bench``. One host read
    per cached step (the widest row's fed count).

    Faithfulness: the fed set (due slots, last step's commits, the window) and the refresh schedule (full at block
    step 0 and multiples of ``cache_reloading_step``) follow horseee/dKV-Cache ``llada_dkv_cache_greedy.py``; ours:
    each due slot's window is found on its own (the reference scans them in turn, so two neighbouring due slots
    there claim distinct window slots and here may share some), the shifted-logits position, ragged rows, and the
    shared cache's ``write_at`` in place of the reference's rebuilt cache. Token for token with the reference's own
    cache on the same decode order, and where due slots' windows overlap, with it once its windows are found per slot
    (``tests/unit/test_dlm_reference.py``, checked against horseee/dKV-Cache at
    49a76fcc43b744ec2d960137f216e419317138b1).

    Args:
        refresh: run the whole canvas every ``refresh`` steps of a block (the reference's ``cache_reloading_step``;
            its example uses 2).
        window: masked slots refreshed around each due slot (the reference's ``window_size``; its example uses 4).
    """

    needs_plan = True  # reads state.planned: the rule must publish it

    def __init__(self, refresh: int = 2, window: int = 4) -> None:
        super().__init__()  # before: [B, G] masked at the previous step's input
        self.refresh = check_int("refresh", refresh, low=1)
        self.window = check_int("window", window, low=0)

    def logits(self, dlm: DLMModel, state: DLMState) -> torch.Tensor:
        """``[B, G, V]`` logits: fresh for the due slots, zeros for slots no fed position predicts."""
        masked, before, planned = state.masked, self.before, state.planned
        self.before = masked
        full = state.step % self.refresh == 0 or self.cache is None or before is None or planned is None
        if full:
            logits, self.cache = full_forward_kept(dlm, state)
            return logits
        assert self.cache is not None and before is not None and planned is not None
        fed = planned | (before & ~masked) | window_slots(planned, masked & ~planned, self.window)
        _, real = canvas_positions(state)
        fed_canvas = torch.zeros_like(real).scatter_(1, state.slots, fed)
        if dlm.shift_logits:  # position p predicts slot p + 1
            fed_canvas |= with_predictors(torch.zeros_like(real).scatter_(1, state.slots, planned))
        return fed_logits(dlm, self.cache, state, fed_canvas & real)


def window_slots(due: torch.Tensor, candidates: torch.Tensor, size: int) -> torch.Tensor:
    """``[B, G]`` bool: for each due slot (``due [B, G]``), the ``size`` nearest ``candidates [B, G]`` in the order
    left 1, right 1, left 2, right 2, ... (dKV-Cache-Greedy's window); the union over a row's due slots."""
    if size == 0:
        return torch.zeros_like(due)
    j = torch.arange(due.shape[1], device=due.device)
    offset = j[None, :] - j[:, None]  # [G, G]: slot j relative to due slot p (rows: p)
    order = (2 * offset.abs() - (offset < 0).long()).float()  # left d -> 2d - 1, right d -> 2d
    key = order[None].masked_fill(~candidates[:, None, :] | ~due[:, :, None], float("inf"))  # [B, G(p), G(j)]
    near = key.topk(min(size, due.shape[1]), dim=-1, largest=False)
    picked = torch.zeros_like(key, dtype=torch.bool).scatter_(-1, near.indices, near.values.isfinite())
    return picked.any(1)
