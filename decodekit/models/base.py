"""The model interface every decodekit component runs models through.

A :class:`LanguageModel` exposes one primitive, :meth:`LanguageModel.forward`: run ``N`` tokens per row with
explicit positions and a 4-D boolean mask against a :class:`~decodekit.cache.KVCache`, returning logits. The
two helpers built on it, :meth:`extend` (append a ragged chain and commit it) and :meth:`score` (run the pending
token plus a draft tree, staged but not committed), are all the speculative loop and model drafters need.
"""

from __future__ import annotations

from typing import Any

import torch

from decodekit.cache import KVCache
from decodekit.masks import add_root, chain_mask, tree_mask
from decodekit.types import Draft


class LanguageModel:
    """Base class of model adapters. Subclasses implement :meth:`forward` and set the attributes below.

    Attributes:
        vocab_size: size ``V`` of the logits.
        eos_token_ids: token ids that end a sequence by default.
        max_context: longest sequence the model supports (None = unknown).
        tokenizer: the matching tokenizer, if known.
    """

    vocab_size: int
    eos_token_ids: tuple[int, ...] = ()
    max_context: int | None = None
    tokenizer: Any = None

    @property
    def device(self) -> torch.device:
        raise NotImplementedError

    def forward(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        mask: torch.Tensor,
        cache: KVCache,
        logits_at: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Run ``tokens [B, N]`` at ``positions [B, N]`` under ``mask [B, 1, N, S]`` (bool, True = attend).

        Called under ``torch.no_grad`` by :meth:`extend`, :meth:`score` and :func:`decodekit.generate`.
        The cache must have been staged for ``N`` tokens (``S = cache.stage(N)``); their K/V land in the staged
        slots. ``logits_at [B, M]`` selects which of the ``N`` positions get logits (default: all).

        Returns:
            logits ``[B, M, V]`` (``M = N`` by default), in the model's dtype.
        """
        raise NotImplementedError

    def new_cache(self, batch_size: int, capacity: int) -> KVCache:
        """An empty cache for ``batch_size`` rows with room for ``capacity`` tokens each (grows if needed)."""
        return KVCache(batch_size, capacity, device=self.device)

    @torch.no_grad()
    def extend(self, cache: KVCache, tokens: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """Append a ragged chain and commit it.

        Args:
            cache: the model's cache; row ``b`` grows by ``counts[b]``.
            tokens: ``[B, N]`` new tokens, right-padded (row ``b`` uses the first ``counts[b] >= 1``).
            counts: ``[B]`` number of real tokens per row.

        Returns:
            ``[B, V]`` logits at each row's last real token (the next-token distribution).
        """
        kv_len = cache.stage(tokens.shape[1])
        mask, positions = chain_mask(cache.lengths, tokens.shape[1], kv_len)
        last = (counts - 1).clamp(min=0)[:, None]
        logits = self.forward(tokens, positions, mask, cache, logits_at=last)
        cache.keep(counts)
        return logits[:, 0]

    @torch.no_grad()
    def score(self, cache: KVCache, pending: torch.Tensor, draft: Draft) -> torch.Tensor:
        """Run the pending token and a draft tree in one forward, staged (commit with ``cache.keep``).

        Args:
            cache: the target's cache, committed up to (not including) the pending token.
            pending: ``[B]`` the sampled token not yet in the cache (the tree's root).
            draft: ``N`` nodes per row.

        Returns:
            ``[B, N + 1, V]`` logits; row 0 is the distribution after the pending token, row ``i + 1`` the
            distribution for the children of node ``i``. Staged slot ``j`` holds input ``j`` (0 = pending).
        """
        tokens = pending[:, None]
        if draft.num_nodes:
            tokens = torch.cat([tokens, draft.tokens.where(draft.valid, 0)], 1)
        kv_len = cache.stage(tokens.shape[1])
        if draft.is_chain:
            mask, positions = chain_mask(cache.lengths, tokens.shape[1], kv_len)
        else:
            mask, positions = tree_mask(cache.lengths, add_root(draft.ancestors), kv_len)
        return self.forward(tokens, positions, mask, cache)
