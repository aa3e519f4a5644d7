"""The :class:`KVCache` class (the slot model is described in :mod:`decodekit.cache`): planning and running a
forward, and keeping its staged tokens; the committed lengths, row selection, validity and snapshots are its
:class:`~decodekit.cache.rows.CommittedRows` side."""

from __future__ import annotations

from collections.abc import Iterable

import torch
from transformers.cache_utils import Cache

from decodekit.cache.rows import CommittedRows
from decodekit.cache.validity import SlotValidity

_STAGE, _WRITE_AT, _ATTEND = "stage", "write_at", "attend"


class KVCache(CommittedRows, Cache):  # type: ignore[misc]  # crop() takes per-row lengths, not Cache's max_length
    """Ragged, row-compactable KV cache.

    Args:
        batch_size: number of rows ``B``.
        capacity: initial number of slots per row ``S_cap`` (grown on demand).
        device: device of the length bookkeeping (buffers follow the model's key states).
    """

    def __init__(self, batch_size: int, capacity: int, device: torch.device | str = "cpu") -> None:
        super().__init__(layers=[])
        self.capacity = capacity
        self._lengths = torch.zeros(batch_size, dtype=torch.long, device=device)
        self._host: list[int] | None = [0] * batch_size  # host mirror of the lengths; None = unknown
        self.keys: list[torch.Tensor] = []  # per layer [B, H, S_cap + 1, D]; the last slot is scratch
        self.values: list[torch.Tensor] = []
        self.validity = SlotValidity()
        self._extent: list[int] = []  # per layer: staged slots past L_b written since the last keep / crop
        self._plan: str | None = None  # what the next forward does: _STAGE, _WRITE_AT or _ATTEND
        self._write_index: torch.Tensor | None = None  # [B, N] slots the next forward writes (ragged / write_at)
        self._write_start: int | None = None  # set when every row writes at the same slot (a slice copy)
        self._offset = self._end = 0  # staged block: slots L_b + offset .. L_b + end - 1
        self._kv_len = 0  # key length S the next forward sees (after attend: the cached part S_c)

    # ------------------------------------------------------------------------------------- forward protocol
    def stage(self, num_new: int, offset: int = 0, *, kv_len: int | None = None) -> int:
        """Reserve slots ``L_b + offset .. L_b + offset + num_new - 1`` for the next forward's ``num_new`` tokens.

        ``offset > 0`` continues a staged block (a self-speculative drafter runs the target's first layers on one
        draft token per step at offsets 0, 1, 2, ...). Grows the buffers if needed; invalidates the staged slots
        when validity is explicit. No host sync while the host mirror is known.

        Args:
            num_new: ``N`` new tokens per row.
            offset: where the block starts, past each row's committed length.
            kv_len: a longer key length, to reach valid slots past the block (a cached suffix); None = the least.

        Returns:
            the key length ``S`` (at least ``max(L) + offset + num_new``); the mask must be ``[B, 1, num_new, S]``.
        """
        lo, hi = self._min_max()
        if kv_len is None:
            kv_len = hi + offset + num_new
        elif kv_len < hi + offset + num_new:
            raise ValueError(f"stage: kv_len={kv_len} is shorter than max(L) + offset + num_new")
        self._reserve(kv_len)
        if lo == hi:  # every row writes at the same slots: update() copies a slice
            self._write_start, self._write_index = lo + offset, None
        else:
            self._write_start = None
            self._write_index = self._lengths[:, None] + torch.arange(
                offset, offset + num_new, device=self._lengths.device
            )
        self.validity.staged(self._lengths, offset, num_new)
        self._plan, self._offset, self._end, self._kv_len = _STAGE, offset, offset + num_new, kv_len
        return kv_len

    def write_at(self, slots: torch.Tensor, kv_len: int | None = None) -> int:
        """Stage a forward whose ``M`` new tokens overwrite ``slots [B, M]`` (``-1`` = padding; written to scratch).

        Committed or not, the slots become valid (validity turns explicit); lengths do not change. For refreshing
        committed K/V (dKV-Cache) and writing a cached suffix block past ``L_b`` (Fast-dLLM dual cache). Data staged
        at an offset may be overwritten, so staged extents are reset.

        Args:
            slots: ``[B, M]`` long, distinct per row; token ``j`` of row ``b`` has position ``slots[b, j]``.
            kv_len: the key length ``S`` (must exceed every slot); None = ``max(max(L), max(slots) + 1)`` (one sync).

        Returns:
            ``S``; the forward's mask must be ``[B, 1, M, S]``.
        """
        if kv_len is None:
            kv_len = max(self._min_max()[1], int(slots.max()) + 1 if slots.numel() else 0)
        self._reserve(kv_len)
        slots = slots.to(self._lengths.device)
        self.validity.set(self._lengths, self.capacity, slots, True)
        self._write_index = slots.where(slots >= 0, self.capacity)
        self._extent = [0] * len(self._extent)
        self._plan, self._write_start, self._kv_len = _WRITE_AT, None, kv_len
        return kv_len

    def attend(self, num_new: int, cached_len: int | None = None) -> int:
        """Run the next forward against the cache without writing its K/V (ephemeral blocks, attend-only queries).

        ``update()`` returns the cached keys ``0 .. S_c - 1`` followed by the ``num_new`` new ones, so new token ``j``
        sits at key index ``S_c + j``; the buffers are unchanged afterwards. Build the mask with
        :func:`decodekit.masks.attend_layout`.

        Args:
            num_new: ``N`` new tokens per row.
            cached_len: ``S_c``; None = ``max(L)`` (more to reach a valid suffix past the committed lengths).

        Returns:
            ``S = S_c + num_new``; the forward's mask must be ``[B, 1, num_new, S]``.
        """
        cached = self._min_max()[1] if cached_len is None else cached_len
        self._reserve(cached)
        self._plan, self._write_index, self._write_start, self._kv_len = _ATTEND, None, None, cached
        return cached + num_new

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """transformers ``Cache`` hook: take ``[B, H, N, D]`` new states of layer ``layer_idx`` (0-based).

        Writes them where the last :meth:`stage` / :meth:`write_at` said (nothing after :meth:`attend`).

        Returns:
            keys and values ``[B, H, S, D]``: slots ``0 .. S - 1`` (after :meth:`attend`: the cached slots
            ``0 .. S_c - 1`` then the new states).
        """
        if self._plan is None:
            raise RuntimeError("KVCache.update called without stage(): run models through decodekit's adapters")
        self.allocate(layer_idx + 1, key_states.shape[1], key_states.shape[3], key_states, value_states.shape[3])
        k_buf, v_buf = self.keys[layer_idx], self.values[layer_idx]
        if self._plan == _ATTEND:
            cached = self._kv_len
            return torch.cat([k_buf[:, :, :cached], key_states], 2), torch.cat([v_buf[:, :, :cached], value_states], 2)
        if self._write_start is not None:  # all rows at the same length: a slice copy
            end = self._write_start + key_states.shape[2]
            k_buf[:, :, self._write_start : end] = key_states
            v_buf[:, :, self._write_start : end] = value_states
        else:
            index = self._write_index.to(key_states.device)[:, None, :, None]
            k_buf.scatter_(2, index.expand_as(key_states), key_states)
            v_buf.scatter_(2, index.expand_as(value_states), value_states)
        if self._plan == _STAGE:
            self._book_staged(layer_idx)
        return k_buf[:, :, : self._kv_len], v_buf[:, :, : self._kv_len]

    # ------------------------------------------------------------------------------ explicit-slot forwards
    def planned_slots(self) -> torch.Tensor | None:
        """``[B, N]`` long: the slots the forward planned by :meth:`stage` or :meth:`write_at` writes (``write_at``'s
        padding: the scratch slot ``capacity``), as a tensor (gpt-fast's ``input_pos``), for a forward that writes
        the buffers itself (:mod:`decodekit.models.compiled`); None after :meth:`attend` or with nothing planned. No
        host sync."""
        if self._plan not in (_STAGE, _WRITE_AT):
            return None
        if self._write_index is not None:
            return self._write_index
        start = self._write_start + torch.arange(self._end - self._offset, device=self._lengths.device)
        return start.expand(self.batch_size, -1)

    def allocate(
        self, num_layers: int, kv_heads: int, head_dim: int, like: torch.Tensor, value_dim: int | None = None
    ) -> None:
        """Make sure layers ``0 .. num_layers - 1`` have their key buffers ``[B, kv_heads, capacity + 1, head_dim]``
        and value buffers (``value_dim`` wide, default ``head_dim``), of ``like``'s dtype and device: what
        :meth:`update` does on a layer's first write."""
        shape = (self.batch_size, kv_heads, self.capacity + 1, head_dim)
        while len(self.keys) < num_layers:
            self.keys.append(like.new_zeros(shape))
            self.values.append(like.new_zeros(shape[:3] + (head_dim if value_dim is None else value_dim,)))
            self._extent.append(0)

    def planned_written(self, layers: Iterable[int]) -> None:
        """Book a forward that wrote the planned slots itself into ``layers`` (0-based cache layers; what
        :meth:`update` books per layer: after :meth:`stage`, the staged extent; after :meth:`write_at`, nothing)."""
        if self._plan == _STAGE:
            for i in layers:
                self._book_staged(i)

    def _book_staged(self, layer_idx: int) -> None:
        """Layer ``layer_idx`` now holds the staged block: it extends the contiguous staged extent when it starts
        within it."""
        if self._offset <= self._extent[layer_idx]:
            self._extent[layer_idx] = max(self._extent[layer_idx], self._end)

    def key_positions(self, positions: torch.Tensor) -> torch.Tensor:
        """Position of the token at each key index the planned forward sees (for position-dependent masks such as
        sliding windows).

        Cached slot ``s`` holds position ``s``; the forward's new token ``j`` sits at slot ``L_b + offset + j``
        (:meth:`stage`; a tree's nodes are not at their slot's position), at key index ``S_c + j`` (:meth:`attend`),
        or at its own position's slot (:meth:`write_at`).

        Args:
            positions: ``[B, N]`` the new tokens' positions (the forward's ``position_ids``).

        Returns:
            ``[B, S]`` long, ``S`` = the key length the forward sees.
        """
        batch, num_new = positions.shape
        device = positions.device
        if self._plan == _ATTEND:
            cached = torch.arange(self._kv_len, device=device).expand(batch, self._kv_len)
            return torch.cat([cached, positions], 1)
        keys = torch.arange(self._kv_len, device=device).expand(batch, self._kv_len)
        if self._plan != _STAGE:
            return keys  # write_at: every slot holds its own position
        index = self._lengths.to(device)[:, None] + torch.arange(self._offset, self._offset + num_new, device=device)
        return keys.clone().scatter_(1, index, positions)

    def get_seq_length(self, layer_idx: int = 0) -> int:
        """Largest committed length (transformers asks; no sync while the host mirror is known)."""
        return self._min_max()[1]

    def get_mask_sizes(self, query_length: int, layer_idx: int = 0) -> tuple[int, int]:
        return (self._kv_len + query_length if self._plan == _ATTEND else self._kv_len), 0

    def staged_extent(self, layer_idx: int) -> int:
        """Slots past each row's ``L_b`` holding K/V that staged forwards wrote in layer ``layer_idx`` (0-based).

        Counts the contiguous run from ``L_b``: a block staged past the extent (a gap) does not extend it. Reset by
        :meth:`keep`, :meth:`crop`, :meth:`select_rows`, :meth:`write_at`.
        """
        return self._extent[layer_idx] if layer_idx < len(self._extent) else 0

    # ----------------------------------------------------------------------------------------- bookkeeping
    def keep(
        self, counts: torch.Tensor, nodes: torch.Tensor | None = None, *, host_counts: int | list[int] | None = None
    ) -> None:
        """Commit staged tokens: row ``b`` keeps ``counts[b]`` tokens staged past ``L_b``.

        Args:
            counts: ``[B]`` how many staged tokens each row keeps.
            nodes: ``[B, M]`` which staged tokens (slot ``L_b + nodes[b, i]``, increasing), gathered into slots
                ``L_b .. L_b + counts[b] - 1``; None for the first ``counts[b]`` (a chain: no copy). Entries past
                ``counts[b]`` are ignored.
            host_counts: the same counts on the host (an int = every row): keeps the host mirror valid.
        """
        if self._plan in (_WRITE_AT, _ATTEND):
            raise RuntimeError(f"KVCache.keep after {self._plan}(): nothing was staged")
        if nodes is not None and nodes.shape[1] > 0:
            m = nodes.shape[1]
            base = self._lengths[:, None]
            src = (base + nodes.clamp(min=0))[:, None, :, None]
            dst = (base + torch.arange(m, device=nodes.device))[:, None, :, None]
            for buf in (*self.keys, *self.values):
                src_i, dst_i = src.to(buf.device), dst.to(buf.device)
                shape = (buf.shape[0], buf.shape[1], m, buf.shape[3])
                buf.scatter_(2, dst_i.expand(shape), buf.gather(2, src_i.expand(shape)))
        counts = counts.to(self._lengths.device)
        self.validity.kept(self._lengths, counts)
        if self._host is not None and host_counts is not None:
            add = [host_counts] * self.batch_size if isinstance(host_counts, int) else host_counts
            host = [n + int(c) for n, c in zip(self._host, add)]
        else:
            host = None
        self._lengths, self._host = self._lengths + counts, host
        self._clear()

    # -------------------------------------------------------------------------------------------- internals
    def _clear(self) -> None:
        self._plan, self._write_index, self._write_start = None, None, None
        self._extent = [0] * len(self._extent)

    def _reserve(self, kv_len: int) -> None:
        if kv_len > self.capacity:
            self._grow(max(kv_len, 2 * self.capacity))

    def _grow(self, capacity: int) -> None:
        def grown(buf: torch.Tensor) -> torch.Tensor:
            out = buf.new_zeros(buf.shape[:2] + (capacity + 1,) + buf.shape[3:])
            out[:, :, : buf.shape[2] - 1] = buf[:, :, :-1]
            return out

        self.keys = [grown(k) for k in self.keys]
        self.values = [grown(v) for v in self.values]
        self.validity.grow(capacity)
        self.capacity = capacity

    def __repr__(self) -> str:
        return f"KVCache(batch={self.batch_size}, capacity={self.capacity}, lengths={self._lengths.tolist()})"
