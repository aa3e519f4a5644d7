"""Block-causal decoding with an exact cache of the finished blocks (block diffusion: SDAR, BD3-LM, CDLM)."""

from __future__ import annotations

import torch

from decodekit.cache import KVCache
from decodekit.dlm.model import DLMModel
from decodekit.dlm.state import DLMState, SlotLogits
from decodekit.masks import attend_layout, block_causal_mask, staged_layout
from decodekit.registry import register


@register("dlm_cache", "block_causal")
class BlockCausalCache:
    """Attention bidirectional within a block and causal across blocks; the prompt and every finished block are
    stored once and never recomputed. A step runs only the current block against the cache without storing it;
    when a block starts, the blocks finished since the last store are run once more with storing (SDAR's
    ``store_kv`` forward; counted in ``DLMStats.cache_forwards``, not in ``nfe``).

    **Exact**: under a block-causal mask nothing before a block depends on it or on anything after it, so the cached
    K/V are what a full recompute would give: the logits equal ``Recompute(block_causal=True)``'s
    (``tests/unit/test_dlm.py``). Made for models trained block-causally; a bidirectional model run this way sees
    less context than it was trained with. With ``shift_logits`` the block's first slot takes the output at the
    previous block's last position, kept from that block's store forward (as Fast-dLLM v2 does).

    Faithfulness: SDAR's ``block_diffusion_generate`` caching (prompt and finished blocks stored, the block run
    ephemerally), with blocks counted from each row's generation start rather than on an absolute grid.
    """

    fixed_blocks = True  # reads state.block: every row in the same block
    block_causal = True  # attends block-causally (what a block-causally trained model needs)
    lookahead = True  # logits_many runs the next block too when state.lookahead asks

    def __init__(self) -> None:
        self.cache: KVCache | None = None
        self.stored: list[int] = []  # host: each row's cached length
        self.last: torch.Tensor | None = None  # [B, V] the output at each row's last stored position
        self.forwards = 0

    def begin(self, state: DLMState) -> None:
        self.cache = None
        self.forwards = 0

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
        start."""
        shift, n = int(dlm.shift_logits), len(canvases)
        lo, hi = state.block[0], (state.lookahead or state.block)[1]
        if self.cache is None:
            self.cache = dlm.lm.new_cache(state.batch_size, state.canvas.shape[1])
            self.cache.set_host_lengths([0] * state.batch_size)
            self.stored = [0] * state.batch_size
        target = [s + lo for s in state.host_starts]
        if target != self.stored:
            self._store(dlm, state, target)
        width = hi - lo
        j = torch.arange(width, device=state.device)
        tokens = torch.cat([c.gather(1, state.starts[:, None] + lo + j) for c in canvases], 1)  # [B, N * W]
        kv_len = self.cache.attend(n * width)
        positions = (self.cache.lengths[:, None] + j).repeat(1, n)
        keys = attend_layout(self.cache.lengths, n * width, kv_len - n * width, positions=positions)
        mask, positions = block_causal_mask(keys, state.block_length, origin=state.starts)
        if n > 1:  # a copy sees the stored keys and itself, not the other copies
            copy = torch.arange(n, device=state.device).repeat_interleave(width)
            key_copy = torch.cat([copy.new_full((kv_len - n * width,), -1), copy])
            mask = mask & ((key_copy[None, :] < 0) | (key_copy[None, :] == copy[:, None]))
        at = (torch.arange(n, device=state.device)[:, None] * width + j[: width - shift]).flatten()
        out = dlm.lm.forward(tokens, positions, mask, self.cache, logits_at=at.expand(state.batch_size, -1))
        fresh = out.logits.float().unflatten(1, (n, width - shift)).transpose(0, 1)  # [N, B, W - shift, V]
        if shift:  # the block's first slot: the previous block's last output, from the store forward
            fresh = torch.cat([self.last[None, :, None].expand(n, -1, -1, -1), fresh], 2)
        return SlotLogits(fresh, lo)

    def _store(self, dlm: DLMModel, state: DLMState, target: list[int]) -> None:
        """Run canvas positions ``stored[b] .. target[b] - 1`` of each row (whole blocks: the prompt, then each
        finished block) with storing; keep the output at each row's last one (it predicts the next slot)."""
        assert self.cache is not None
        counts = [t - s for t, s in zip(target, self.stored)]
        width = max(counts)
        start = torch.tensor(self.stored, device=state.device)
        index = (start[:, None] + torch.arange(width, device=state.device)).clamp(max=state.canvas.shape[1] - 1)
        tokens = state.canvas.gather(1, index)
        count = torch.tensor(counts, device=state.device)
        kv_len = self.cache.stage(width)
        keys = staged_layout(self.cache.lengths, width, kv_len, counts=count)
        mask, positions = block_causal_mask(keys, state.block_length, origin=state.starts)
        last = (count - 1).clamp(min=0)[:, None]
        self.last = dlm.lm.forward(tokens, positions, mask, self.cache, logits_at=last).logits[:, 0].float()
        self.cache.keep(count, host_counts=counts)
        self.stored = target
        self.forwards += 1
