"""Block-causal decoding with an exact cache of the finished blocks (block diffusion: SDAR, BD3-LM, CDLM)."""

from __future__ import annotations

import torch

from decodekit.cache import KVCache
from decodekit.dlm.model import DLMModel
from decodekit.dlm.state import DLMState, SlotLogits
from decodekit.masks import KeyLayout, block_causal_mask
from decodekit.registry import register


@register("dlm_cache", "block_causal")
class BlockCausalCache:
    """Attention bidirectional within a block and causal across blocks; the prompt and every finished block are
    stored once and never recomputed. A step runs the current block against the cache without keeping it. The
    first forward after a block ends also stores what finished since the last store (the prompt, at the first
    forward): those tokens run in the same forward, ahead of the block, and are kept; so the sampler runs one
    forward a step and nothing else (``nfe`` counts every forward).

    **Exact**: under a block-causal mask nothing before a block depends on it or on anything after it, so the cached
    K/V are what a full recompute would give: the logits equal ``Recompute(block_causal=True)``'s
    (``tests/unit/test_dlm.py``). Made for models trained block-causally; a bidirectional model run this way sees
    less context than it was trained with. With ``shift_logits`` the block's first slot takes the output at the
    previous block's last position, computed when that block is stored (as Fast-dLLM v2 does).

    Faithfulness: SDAR's ``block_diffusion_generate`` caching (prompt and finished blocks stored, the block run
    ephemerally), on either block grid (:class:`~decodekit.dlm.DLMModel`'s ``block_grid``: SDAR's own is the
    absolute one); SDAR runs a separate ``store_kv`` forward per finished block, which here shares the next step's
    forward (as BD3-LM's sampler does): the same logits, one forward fewer per block.
    """

    fixed_blocks = True  # reads state.block: every row in the same block
    block_causal = True  # attends block-causally (what a block-causally trained model needs)
    lookahead = True  # logits_many runs the next block too when state.lookahead asks

    def __init__(self) -> None:
        self.cache: KVCache | None = None
        self.last: torch.Tensor | None = None  # [B, V] the output at each row's last stored position

    def begin(self, state: DLMState) -> None:
        self.cache, self.last = None, None

    def logits(self, dlm: DLMModel, state: DLMState) -> SlotLogits:
        """The current block's logits only (:class:`~decodekit.dlm.state.SlotLogits`)."""
        out = self.logits_many(dlm, state, state.canvas[None])
        return SlotLogits(out.logits[0], out.lo)

    def logits_many(self, dlm: DLMModel, state: DLMState, canvases: torch.Tensor) -> SlotLogits:
        """The current block's logits on each of ``canvases [N, B, T]`` (variants of ``state.canvas`` that differ
        from it only in the block: self-speculative drafts), ``[N, B, W, V]`` in one forward: the ``N`` copies of
        the block sit side by side in the sequence, at the same positions, each seeing the stored K/V and itself
        only. With ``state.lookahead`` each copy is followed by the next block (still masked), which sees the stored
        K/V and that copy's block, as it will once the block is stored: ``[N, B, W + W', V]`` from the block's
        start.

        The forward's tokens, per row: the ``P`` positions finished and not yet stored (padded to the widest row;
        none on most steps), then the ``N`` copies of the ``W`` slots; all are written to the cache's buffers (the
        copies past the stored length: a wide draft graph grows the buffers once, by ``N * W`` slots a row) and the
        row's finished ones are kept."""
        shift, n = int(dlm.shift_logits), len(canvases)
        lo, hi = state.block[0], (state.lookahead or state.block)[1]
        if self.cache is None:
            self.cache = dlm.lm.new_cache(state.batch_size, state.canvas.shape[1])
            self.cache.set_host_lengths([0] * state.batch_size)
        stored_host = self.cache.host_lengths()  # the cache's host mirror: no sync
        counts = [s + lo - t for s, t in zip(state.host_starts, stored_host)]  # host: finished, not stored yet
        pending, width = max(counts), hi - lo
        stored = self.cache.lengths  # [B], the same on the device
        j = torch.arange(width, device=state.device)
        new = torch.arange(pending, device=state.device)
        tokens = torch.cat(
            [state.canvas.gather(1, (stored[:, None] + new).clamp(max=state.canvas.shape[1] - 1))]
            + [c.gather(1, state.starts[:, None] + lo + j) for c in canvases],
            1,
        )  # [B, P + N * W]
        count = torch.tensor(counts, device=state.device)
        view = self.cache.stage(pending + n * width)
        keys, copy = _layout(stored, count, pending, n, width, view.kv_len)
        mask, positions = block_causal_mask(keys, state.block_length, origin=state.starts)
        if n > 1:  # a copy sees the cached and pending keys and itself, not the other copies
            query = copy.gather(1, keys.own)  # [B, P + N * W]: each query's copy, -1 for the pending positions
            mask = mask & ((copy[:, None, :] < 0) | (copy[:, None, :] == query[:, :, None]))[:, None]
        at = pending + (torch.arange(n, device=state.device)[:, None] * width + j[: width - shift]).flatten()
        at = at.expand(state.batch_size, -1)
        last = shift and pending
        if last:  # the output at each row's last newly stored position predicts the block's first slot
            at = torch.cat([(count - 1).clamp(min=0)[:, None], at], 1)
        out = dlm.lm.forward(tokens, positions, mask, view, logits_at=at).logits.float()
        if last:
            self.last, out = out[:, 0], out[:, 1:]
        elif shift and self.last is None:  # nothing stored yet: every first slot holds a prompt token (absolute grid)
            self.last = out.new_zeros(out.shape[0], out.shape[-1])
        if pending:
            self.cache.keep(count, host_counts=counts)
        fresh = out.unflatten(1, (n, width - shift)).transpose(0, 1)  # [N, B, W - shift, V]
        if shift:  # the block's first slot: the previous block's last output
            fresh = torch.cat([self.last[None, :, None].expand(n, -1, -1, -1), fresh], 2)
        return SlotLogits(fresh, lo)


def _layout(
    stored: torch.Tensor, count: torch.Tensor, pending: int, n: int, width: int, kv_len: int
) -> tuple[KeyLayout, torch.Tensor]:
    """Keys after ``cache.stage(P + N * W)``: row ``b``'s cached slots ``< stored[b]``, then its ``P`` pending
    positions at their own slots (the first ``count[b]`` real), then ``N`` copies of the ``W`` slots from position
    ``stored[b] + count[b]``. Returns the layout and ``[B, S]`` each key's copy (``-1``: cached or pending)."""
    device = stored.device
    slot = torch.arange(kv_len, device=device)[None, :]
    rel = slot - stored[:, None]  # [B, S]: index into the forward's tokens
    copy_rel = rel - pending
    in_copy = (copy_rel >= 0) & (copy_rel < n * width)
    block_start = (stored + count)[:, None]
    key_positions = torch.where(in_copy, block_start + copy_rel.remainder(width), slot)
    usable = (rel < count[:, None]) | in_copy  # cached (rel < 0), a real pending position, or a copy
    copy = torch.where(in_copy, torch.div(copy_rel, width, rounding_mode="floor"), -1)
    i = torch.arange(pending + n * width, device=device)[None, :]
    positions = torch.where(i < pending, stored[:, None] + i, block_start + (i - pending).remainder(width))
    return KeyLayout(key_positions, usable, positions, stored[:, None] + i), copy
