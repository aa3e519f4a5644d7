""":class:`CacheView`: one forward's access to a :class:`~decodekit.cache.KVCache`, returned by
:meth:`~decodekit.cache.KVCache.stage`, :meth:`~decodekit.cache.KVCache.write_at` and
:meth:`~decodekit.cache.KVCache.attend` and passed to the model's forward in the cache's place.

The view says, as values, what the forward does with the cache: the key length ``S`` its mask spans
(:attr:`CacheView.kv_len`) and the slots its ``N`` new tokens write (:meth:`CacheView.slots`, a ``[B, N]`` tensor:
gpt-fast's ``input_pos``), or that they write nothing (``attend``). The cache keeps no plan for its next forward: a
forward writes exactly where the view it was given says, and a view made before the cache last changed
(:meth:`~decodekit.cache.KVCache.keep`, ``crop``, ``select_rows``, ``restore``, or a grown capacity) refuses to run.

It is a transformers ``Cache``: transformers' attention layers call :meth:`CacheView.update` per layer, and so do
decodekit's own forwards (:mod:`decodekit.models.lean`, the draft heads).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Literal

import torch
from transformers.cache_utils import Cache

if TYPE_CHECKING:
    from decodekit.cache.kv import KVCache

__all__ = ["CacheView", "Kind"]

Kind = Literal["stage", "write_at", "attend"]


class CacheView(Cache):  # type: ignore[misc]
    """What one forward reads from and writes to a :class:`~decodekit.cache.KVCache` (module docstring).

    Attributes:
        cache: the cache.
        kind: ``"stage"`` (new tokens at slots ``L_b + offset + j``, committed later by ``cache.keep``),
            ``"write_at"`` (new tokens overwrite given slots) or ``"attend"`` (new tokens attend, nothing stored).
        kv_len: ``S``, the key length the forward's mask ``[B, 1, N, S]`` spans.
        cached_len: the cached slots ``0 .. S_c - 1`` the forward reads (``attend``: ``S - N``; else ``S``).
        offset: a staged block's offset past each row's committed length (0 otherwise).
    """

    def __init__(
        self,
        cache: KVCache,
        kind: Kind,
        kv_len: int,
        lengths: torch.Tensor,
        *,
        cached_len: int | None = None,
        index: torch.Tensor | None = None,
        start: int | None = None,
        offset: int = 0,
        num_new: int = 0,
    ) -> None:
        super().__init__(layers=[])
        self.cache, self.kind, self.kv_len, self.offset = cache, kind, kv_len, offset
        self.cached_len = kv_len if cached_len is None else cached_len
        self._lengths = lengths  # [B] committed lengths when the view was made
        self._index = index  # [B, N] written slots (None: every row from `start`, a slice copy; or attend)
        self._start = start
        self._num_new = num_new
        self._version = cache.version

    # ------------------------------------------------------------------------------------------ the plan
    def slots(self) -> torch.Tensor | None:
        """``[B, N]`` long: the slots the forward writes (``write_at``'s padding: the scratch slot ``capacity``), as
        a tensor for a forward that writes the buffers itself (:mod:`decodekit.models.compiled`); None for
        ``attend``. No host sync."""
        if self.kind == "attend":
            return None
        if self._index is not None:
            return self._index
        start = self._start + torch.arange(self._num_new, device=self._lengths.device)
        return start.expand(len(self._lengths), -1)

    def key_positions(self, positions: torch.Tensor) -> torch.Tensor:
        """Position of the token at each key index the forward sees (for position-dependent masks such as sliding
        windows).

        Cached slot ``s`` holds position ``s``; new token ``j`` sits at slot ``L_b + offset + j`` (``stage``; a
        tree's nodes are not at their slot's position), at key index ``S_c + j`` (``attend``), or at its own
        position's slot (``write_at``).

        Args:
            positions: ``[B, N]`` the new tokens' positions (the forward's ``position_ids``).

        Returns:
            ``[B, S]`` long, ``S`` = the key length the forward sees.
        """
        batch, num_new = positions.shape
        device = positions.device
        keys = torch.arange(self.cached_len, device=device).expand(batch, self.cached_len)
        if self.kind == "attend":
            return torch.cat([keys, positions], 1)
        if self.kind == "write_at":
            return keys  # every slot holds its own position
        index = self._lengths.to(device)[:, None] + torch.arange(self.offset, self.offset + num_new, device=device)
        return keys.clone().scatter_(1, index, positions)

    # ----------------------------------------------------------------------------------- writing the K/V
    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """transformers ``Cache`` hook: take ``[B, H, N, D]`` new states of layer ``layer_idx`` (0-based), write
        them where this view says (nothing for ``attend``).

        Returns:
            keys and values ``[B, H, S, D]``: slots ``0 .. S - 1`` (``attend``: the cached slots ``0 .. S_c - 1``,
            then the new states).
        """
        self.check()
        cache = self.cache
        cache.allocate(layer_idx + 1, key_states.shape[1], key_states.shape[3], key_states, value_states.shape[3])
        k_buf, v_buf = cache.keys[layer_idx], cache.values[layer_idx]
        if self.kind == "attend":
            cached = self.cached_len
            return torch.cat([k_buf[:, :, :cached], key_states], 2), torch.cat([v_buf[:, :, :cached], value_states], 2)
        if self._index is None:  # every row at the same slots: a slice copy
            end = self._start + key_states.shape[2]
            k_buf[:, :, self._start : end] = key_states
            v_buf[:, :, self._start : end] = value_states
        else:
            index = self._index.to(key_states.device)[:, None, :, None]
            k_buf.scatter_(2, index.expand_as(key_states), key_states)
            v_buf.scatter_(2, index.expand_as(value_states), value_states)
        self.written((layer_idx,))
        return k_buf[:, :, : self.kv_len], v_buf[:, :, : self.kv_len]

    def written(self, layers: Iterable[int]) -> None:
        """Book that this view's slots of ``layers`` (0-based) now hold the forward's K/V: what :meth:`update` books
        per layer, for a forward that writes the buffers itself. A staged block extends the layer's staged extent
        (``cache.staged_extent``)."""
        if self.kind == "stage":
            self.cache.book_staged(layers, self.offset, self.offset + self._num_new)

    def check(self) -> None:
        """Raise ``RuntimeError`` if the cache changed since this view was made (its slots may be wrong now)."""
        if self._version != self.cache.version:
            raise RuntimeError(
                f"a CacheView from {self.kind}() was used after its cache changed (keep, crop, select_rows, restore "
                f"or a grown capacity): call cache.{self.kind}(...) again for this forward"
            )

    # ------------------------------------------------------------------------------ transformers' queries
    def get_seq_length(self, layer_idx: int = 0) -> int:
        """Largest committed length (transformers asks; no sync while the cache's host mirror is known)."""
        return self.cache.get_seq_length()

    def get_mask_sizes(self, query_length: int, layer_idx: int = 0) -> tuple[int, int]:
        return self.kv_len, 0

    def __repr__(self) -> str:
        return f"CacheView({self.kind}, kv_len={self.kv_len}, offset={self.offset}, cache={self.cache!r})"
