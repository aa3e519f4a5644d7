"""The cache strategy contract and the exact baseline: recompute the whole canvas every step."""

from __future__ import annotations

import torch

from decodekit.cache import KVCache
from decodekit.checks import check_bool, check_int
from decodekit.dlm.model import DLMModel
from decodekit.dlm.state import DLMState
from decodekit.masks import bidirectional_mask, write_at_layout
from decodekit.registry import register


def full_forward(
    dlm: DLMModel, state: DLMState, block_causal: bool = False, canvases: torch.Tensor | None = None
) -> tuple[torch.Tensor, KVCache]:
    """The whole canvas, bidirectional (or block-causal over the call's blocks): ``[B, G, V]`` logits and the
    staged cache (:meth:`DLMModel.forward`). ``canvases [N, B, T]``: variants of the canvas instead, run as ``N * B``
    rows (``[N * B, G, V]`` logits)."""
    n, canvas = (1, state.canvas) if canvases is None else (len(canvases), canvases.flatten(0, 1))
    blocks = state.block_length if block_causal else None
    lengths, starts = state.lengths.repeat(n), state.starts.repeat(n)
    return dlm.forward(canvas, lengths, starts, state.gen_length, block_causal=blocks)


def full_forward_kept(dlm: DLMModel, state: DLMState) -> tuple[torch.Tensor, KVCache]:
    """:func:`full_forward` keeping every real position's K/V (a refresh that :func:`rewrite_forward` then
    updates in place)."""
    logits, cache = full_forward(dlm, state)
    cache.keep(state.lengths, host_counts=[s + state.gen_length for s in state.host_starts])
    return logits, cache


def rewrite_forward(dlm: DLMModel, cache: KVCache, state: DLMState, slots: torch.Tensor) -> torch.Tensor:
    """Run the canvas tokens at ``slots [B, M]`` (canvas indices, ``-1`` = padding) bidirectionally against the
    kept K/V of the whole canvas, overwriting their K/V in place; returns their ``[B, M, V]`` float32 logits."""
    tokens = state.canvas.gather(1, slots.clamp(min=0))
    view = cache.write_at(slots, kv_len=state.canvas.shape[1])
    mask, positions = bidirectional_mask(write_at_layout(slots, cache.key_mask(view.kv_len)))
    return dlm.lm.forward(tokens, positions, mask, view).logits.float()


def fed_logits(dlm: DLMModel, cache: KVCache, state: DLMState, fed: torch.Tensor) -> torch.Tensor:
    """Run the canvas positions where ``fed [B, T]`` (bool) against the kept K/V of the rest (:func:`rewrite_forward`,
    their K/V rewritten in place) and return ``[B, G, V]`` logits of the generation slots they predict (slot ``p``
    from position ``p``, or ``p - 1`` with ``shift_logits``); zeros for slots no fed position predicts. One host
    read: the widest row's fed count."""
    counts = fed.sum(1, keepdim=True)
    width = max(int(counts.max()), 1)
    order = (~fed).to(torch.int8).sort(dim=1, stable=True).indices[:, :width]  # fed positions first, in order
    slots = order.where(torch.arange(width, device=state.device) < counts, -1)
    fresh = rewrite_forward(dlm, cache, state, slots)
    target = (slots - state.starts[:, None] + int(dlm.shift_logits)).where(slots >= 0, state.gen_length)
    target = target.where((target >= 0) & (target < state.gen_length), state.gen_length)
    out = fresh.new_zeros(state.batch_size, state.gen_length + 1, fresh.shape[-1])
    out[torch.arange(state.batch_size, device=state.device)[:, None], target] = fresh
    return out[:, : state.gen_length]


def region_span(state: DLMState) -> tuple[torch.Tensor, torch.Tensor]:
    """``(first, end)``, each ``[B]``, under an adaptive region schedule (``state.region``): each row's first masked
    slot in its region (``G`` if none; every slot before it is committed, the schedules decode left to right) and
    one past its region's last slot (0 if empty)."""
    region = state.in_block
    j = torch.arange(state.gen_length, device=state.device)
    first = torch.where(region & state.masked, j, state.gen_length).amin(1)
    end = torch.where(region, j + 1, 0).amax(1)
    return first, end


def predicting(dlm: DLMModel, state: DLMState, lo: torch.Tensor, hi: torch.Tensor) -> torch.Tensor:
    """``[B, T]`` bool: the canvas positions whose outputs predict slots ``lo[b] <= j < hi[b]`` (position
    ``P_b + j``, or ``P_b + j - 1`` with ``shift_logits``)."""
    position, real = canvas_positions(state)
    slot = position[None, :] - state.starts[:, None] + int(dlm.shift_logits)
    return real & (slot >= lo[:, None]) & (slot < hi[:, None])


def refreshes(state: DLMState, refresh: int | None) -> bool:
    """Whether a prefix / dual cache recomputes the canvas this step: a round's (block's) first step, and every
    ``refresh`` steps within it."""
    return state.step == 0 or bool(refresh and state.step % refresh == 0)


class RegionSpans:
    """The prefix and dual caches under an adaptive region schedule (``state.region``): a refresh step
    (:func:`refreshes`) runs the whole canvas, keeps every position's K/V and records each row's first masked slot
    in its region; a later step feeds each row's positions that predict the slots from there to ``end`` (the
    generation's end for the prefix cache; ``to_region_end``: the region's current end, for the dual cache) through
    :func:`fed_logits`. The schedules decode left to right (a row's first masked slot never moves left), so the fed
    span always covers the region, also when it slides within a round (DCD)."""

    def __init__(self, to_region_end: bool, refresh: int | None = None) -> None:
        self.to_region_end = to_region_end
        self.refresh = refresh
        self.cache: KVCache | None = None
        self.first: torch.Tensor | None = None  # [B] each row's first fed slot

    def logits(self, dlm: DLMModel, state: DLMState) -> torch.Tensor:
        if refreshes(state, self.refresh) or self.cache is None or self.first is None:
            logits, self.cache = full_forward_kept(dlm, state)
            self.first = region_span(state)[0]
            return logits
        end = region_span(state)[1] if self.to_region_end else torch.full_like(self.first, state.gen_length)
        return fed_logits(dlm, self.cache, state, predicting(dlm, state, self.first, end))


class RefreshedCache:
    """The prefix and dual caches' shared state: ``refresh``, the kept cache and the adaptive-region form
    (:class:`RegionSpans`, fed to the generation's end unless ``to_region_end``)."""

    to_region_end = False

    def __init__(self, refresh: int | None = None) -> None:
        self.refresh = check_int("refresh", refresh, low=1, optional=True)
        self.cache: KVCache | None = None
        self.adaptive = RegionSpans(refresh=self.refresh, to_region_end=self.to_region_end)


class DelayedCache:
    """The dKV caches' shared state: the kept canvas K/V (``cache``) and what the previous step's input held
    (``before``), both cleared when a call begins."""

    def __init__(self) -> None:
        self.cache: KVCache | None = None
        self.before: torch.Tensor | None = None

    def begin(self, state: DLMState) -> None:
        self.cache, self.before = None, None


def with_predictors(fed: torch.Tensor) -> torch.Tensor:
    """``fed [B, T]`` bool plus each fed position's predecessor (with shifted logits position ``p`` predicts
    ``p + 1``)."""
    return fed | torch.cat([fed[:, 1:], fed.new_zeros(fed.shape[0], 1)], 1)


def canvas_positions(state: DLMState) -> tuple[torch.Tensor, torch.Tensor]:
    """``(position [T], real [B, T])``: canvas indices, and which of them hold a row's prompt or generation slots."""
    position = torch.arange(state.canvas.shape[1], device=state.device)
    return position, position < state.lengths[:, None]


@register("dlm_cache", "recompute")
class Recompute:
    """No cache: every step recomputes the whole canvas (LLaDA's reference; exact). ``cache=None`` is this.

    Args:
        block_causal: attend block-causally (bidirectional within a block, causal across the call's blocks: block
            diffusion models); the reference that :class:`~decodekit.dlm.caches.BlockCausalCache` equals exactly.
    """

    lookahead = True  # logits_many predicts every slot, the next block's included

    def __init__(self, block_causal: bool = False) -> None:
        self.block_causal = check_bool("block_causal", block_causal)

    def logits(self, dlm: DLMModel, state: DLMState) -> torch.Tensor:
        """``[B, G, V]`` float32 logits of the generation region for this step."""
        return full_forward(dlm, state, self.block_causal)[0]

    def logits_many(self, dlm: DLMModel, state: DLMState, canvases: torch.Tensor) -> torch.Tensor:
        """``[N, B, G, V]``: for each of ``canvases [N, B, T]`` (variants of ``state.canvas``: self-speculative drafts)
        what :meth:`logits` gives on it, in one forward of ``N * B`` rows."""
        out, _ = full_forward(dlm, state, self.block_causal, canvases)
        return out.unflatten(0, (len(canvases), state.batch_size))
