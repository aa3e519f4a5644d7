"""The :class:`KVCache` class (the slot model is described in :mod:`decodekit.cache`): making the
:class:`~decodekit.cache.view.CacheView` a forward runs against, and keeping its staged tokens; the committed lengths,
row selection, validity and snapshots are its :class:`~decodekit.cache.rows.CommittedRows` side."""

from __future__ import annotations

from collections.abc import Iterable

import torch

from decodekit.cache.rows import CommittedRows
from decodekit.cache.validity import SlotValidity
from decodekit.cache.view import CacheView


class KVCache(CommittedRows):
    """Ragged, row-compactable KV cache.

    A forward runs against a :class:`~decodekit.cache.view.CacheView` made by :meth:`stage`, :meth:`write_at` or
    :meth:`attend` (the slots it writes, the keys it sees), never against the cache itself.

    Args:
        batch_size: number of rows ``B``.
        capacity: initial number of slots per row ``S_cap`` (grown on demand).
        device: device of the length bookkeeping (buffers follow the model's key states).
    """

    def __init__(self, batch_size: int, capacity: int, device: torch.device | str = "cpu") -> None:
        self.capacity = capacity
        self._lengths = torch.zeros(batch_size, dtype=torch.long, device=device)
        self._host: list[int] | None = [0] * batch_size  # host mirror of the lengths; None = unknown
        self.keys: list[torch.Tensor] = []  # per layer [B, H, S_cap + 1, D]; the last slot is scratch
        self.values: list[torch.Tensor] = []
        self.validity = SlotValidity()
        self._extent: list[int] = []  # per layer: staged slots past L_b written since the last keep / crop
        self.version = 0  # bumped whenever views made before stop being right (CacheView.check)
        self._last: str | None = None  # the kind of the last view made (keep refuses after write_at / attend)

    # ------------------------------------------------------------------------------------------ forward views
    def stage(self, num_new: int, offset: int = 0, *, kv_len: int | None = None) -> CacheView:
        """A forward whose ``num_new`` tokens go to slots ``L_b + offset .. L_b + offset + num_new - 1``.

        ``offset > 0`` continues a staged block (a self-speculative drafter runs the target's first layers on one
        draft token per step at offsets 0, 1, 2, ...). Nothing is committed until :meth:`keep`. Grows the buffers
        if needed; invalidates the staged slots when validity is explicit. No host sync while the host mirror is
        known.

        Args:
            num_new: ``N`` new tokens per row.
            offset: where the block starts, past each row's committed length.
            kv_len: a longer key length, to reach valid slots past the block (a cached suffix); None = the least.

        Returns:
            the forward's view; its ``kv_len`` ``S`` is at least ``max(L) + offset + num_new``, and the mask must be
            ``[B, 1, num_new, S]``.
        """
        lo, hi = self._min_max()
        if kv_len is None:
            kv_len = hi + offset + num_new
        elif kv_len < hi + offset + num_new:
            raise ValueError(f"stage: kv_len={kv_len} is shorter than max(L) + offset + num_new")
        self._reserve(kv_len)
        index = None
        if lo != hi:  # ragged rows: a scatter (else every row writes from the same slot: a slice copy)
            index = self._lengths[:, None] + torch.arange(offset, offset + num_new, device=self._lengths.device)
        self.validity.staged(self._lengths, offset, num_new)
        self._last = "stage"
        return CacheView(
            self, "stage", kv_len, self._lengths, index=index, start=lo + offset, offset=offset, num_new=num_new
        )

    def write_at(self, slots: torch.Tensor, kv_len: int | None = None) -> CacheView:
        """A forward whose ``M`` new tokens overwrite ``slots [B, M]`` (``-1`` = padding; written to scratch).

        Committed or not, the slots become valid (validity turns explicit); lengths do not change. For refreshing
        committed K/V (dKV-Cache) and writing a cached suffix block past ``L_b`` (Fast-dLLM dual cache). Data staged
        at an offset may be overwritten, so staged extents are reset.

        Args:
            slots: ``[B, M]`` long, distinct per row; token ``j`` of row ``b`` has position ``slots[b, j]``.
            kv_len: the key length ``S`` (must exceed every slot); None = ``max(max(L), max(slots) + 1)`` (one sync).

        Returns:
            the forward's view (``kv_len`` = ``S``); the forward's mask must be ``[B, 1, M, S]``.
        """
        if kv_len is None:
            kv_len = max(self._min_max()[1], int(slots.max()) + 1 if slots.numel() else 0)
        self._reserve(kv_len)
        slots = slots.to(self._lengths.device)
        self.validity.set(self._lengths, self.capacity, slots, True)
        self._extent = [0] * len(self._extent)
        self._last = "write_at"
        index = slots.where(slots >= 0, self.capacity)
        return CacheView(self, "write_at", kv_len, self._lengths, index=index, num_new=slots.shape[1])

    def attend(self, num_new: int, cached_len: int | None = None) -> CacheView:
        """A forward that attends the cache without writing its K/V (ephemeral blocks, attend-only queries).

        The view's ``update()`` returns the cached keys ``0 .. S_c - 1`` followed by the ``num_new`` new ones, so new
        token ``j`` sits at key index ``S_c + j``; the buffers are unchanged afterwards. Build the mask with
        :func:`decodekit.masks.attend_layout`.

        Args:
            num_new: ``N`` new tokens per row.
            cached_len: ``S_c``; None = ``max(L)`` (more to reach a valid suffix past the committed lengths).

        Returns:
            the forward's view, ``kv_len`` ``S = S_c + num_new``; the forward's mask must be ``[B, 1, num_new, S]``.
        """
        cached = self._min_max()[1] if cached_len is None else cached_len
        self._reserve(cached)
        self._last = "attend"
        return CacheView(self, "attend", cached + num_new, self._lengths, cached_len=cached, num_new=num_new)

    def update(self, *args, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
        """Refuses: a forward writes through the view :meth:`stage`, :meth:`write_at` or :meth:`attend` returned."""
        raise TypeError(
            "a model's forward was given the KVCache itself: pass it the CacheView that cache.stage(), "
            "cache.write_at() or cache.attend() returned for this forward"
        )

    # ------------------------------------------------------------------------------ explicit-slot forwards
    def allocate(
        self, num_layers: int, kv_heads: int, head_dim: int, like: torch.Tensor, value_dim: int | None = None
    ) -> None:
        """Make sure layers ``0 .. num_layers - 1`` have their key buffers ``[B, kv_heads, capacity + 1, head_dim]``
        and value buffers (``value_dim`` wide, default ``head_dim``), of ``like``'s dtype and device: what a view's
        ``update`` does on a layer's first write."""
        shape = (self.batch_size, kv_heads, self.capacity + 1, head_dim)
        while len(self.keys) < num_layers:
            self.keys.append(like.new_zeros(shape))
            self.values.append(like.new_zeros(shape[:3] + (head_dim if value_dim is None else value_dim,)))
            self._extent.append(0)

    def book_staged(self, layers: Iterable[int], offset: int, end: int) -> None:
        """Layers ``layers`` (0-based) now hold a staged block at offsets ``offset .. end - 1``: it extends each
        one's contiguous staged extent when it starts within it (a view books its own writes)."""
        for i in layers:
            if offset <= self._extent[i]:
                self._extent[i] = max(self._extent[i], end)

    def get_seq_length(self, layer_idx: int = 0) -> int:
        """Largest committed length (no sync while the host mirror is known)."""
        return self._min_max()[1]

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
        if self._last in ("write_at", "attend"):  # before anything moves: a refused keep changes nothing
            raise RuntimeError(f"KVCache.keep after {self._last}(): nothing was staged")
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
        self.version, self._last = self.version + 1, None
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
        self.version += 1

    def __repr__(self) -> str:
        return f"KVCache(batch={self.batch_size}, capacity={self.capacity}, lengths={self._lengths.tolist()})"
