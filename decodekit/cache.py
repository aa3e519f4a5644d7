"""KVCache: the one key/value store of decodekit (target, draft models, and later DLM samplers).

Per layer it owns key and value buffers ``[B, H, S_cap, D]`` and keeps one committed length per row, so rows are
ragged without padding: row ``b``'s committed tokens sit in slots ``0 .. L_b - 1`` and slot index == position.

A forward writes its ``N`` new tokens to the *staged* slots ``L_b .. L_b + N - 1`` (see :meth:`stage`); nothing is
committed until :meth:`keep` says which of the staged tokens to keep (a gather that compacts an accepted tree
path into contiguous slots). Stock transformers models write into it through the ``Cache.update`` interface;
decodekit always passes its own 4-D mask and position ids, so the model never asks the cache for lengths.

Buffers are allocated lazily at the first ``update`` (shapes, dtype and device come from the model) and grow
when a forward needs more slots than allocated.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache


class KVCache(Cache):
    """Ragged, row-compactable KV cache.

    Args:
        batch_size: number of rows ``B``.
        capacity: initial number of slots per row ``S_cap`` (grown on demand).
        device: device of the length bookkeeping (buffers follow the model's key states).
    """

    def __init__(self, batch_size: int, capacity: int, device: torch.device | str = "cpu") -> None:
        super().__init__(layers=[])
        self.capacity = capacity
        self.lengths = torch.zeros(batch_size, dtype=torch.long, device=device)
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self._write_index: torch.Tensor | None = None  # [B, N] staged slots
        self._write_start: int | None = None  # set when every row writes at the same slot (a slice copy)
        self._kv_len = 0

    # ------------------------------------------------------------------------------------------- properties
    @property
    def batch_size(self) -> int:
        return self.lengths.shape[0]

    @property
    def is_compileable(self) -> bool:  # transformers asks; our buffers are not static-shaped
        return False

    # ------------------------------------------------------------------------------------- forward protocol
    def stage(self, num_new: int) -> int:
        """Reserve slots ``L_b .. L_b + num_new - 1`` for the next forward; returns the key length ``S`` it sees.

        Grows the buffers if needed. The forward's mask must be ``[B, 1, num_new, S]``.
        """
        lo, hi = torch.stack(torch.aminmax(self.lengths)).tolist() if self.batch_size else (0, 0)
        kv_len = hi + num_new
        if kv_len > self.capacity:
            self._grow(max(kv_len, 2 * self.capacity))
        if lo == hi:  # every row writes at the same slots: update() copies a slice
            self._write_start, self._write_index = lo, None
        else:
            self._write_start = None
            self._write_index = self.lengths[:, None] + torch.arange(num_new, device=self.lengths.device)
        self._kv_len = kv_len
        return kv_len

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """transformers ``Cache`` hook: write ``[B, H, N, D]`` states at the staged slots; return ``[B, H, S, D]``."""
        if self._write_index is None and self._write_start is None:
            raise RuntimeError("KVCache.update called without stage(): run models through decodekit's adapters")
        while len(self.keys) <= layer_idx:
            shape = (self.batch_size, key_states.shape[1], self.capacity, key_states.shape[3])
            self.keys.append(key_states.new_zeros(shape))
            self.values.append(value_states.new_zeros(shape[:3] + (value_states.shape[3],)))
        k_buf, v_buf = self.keys[layer_idx], self.values[layer_idx]
        if self._write_start is not None:  # all rows at the same length: a slice copy
            end = self._write_start + key_states.shape[2]
            k_buf[:, :, self._write_start : end] = key_states
            v_buf[:, :, self._write_start : end] = value_states
        else:
            index = self._write_index.to(key_states.device)[:, None, :, None]
            k_buf.scatter_(2, index.expand_as(key_states), key_states)
            v_buf.scatter_(2, index.expand_as(value_states), value_states)
        return k_buf[:, :, : self._kv_len], v_buf[:, :, : self._kv_len]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return int(self.lengths.max()) if self.batch_size else 0

    def get_mask_sizes(self, query_length: int, layer_idx: int = 0) -> tuple[int, int]:
        return self._kv_len, 0

    def get_max_length(self, layer_idx: int | None = None) -> int:
        return self.capacity

    # ----------------------------------------------------------------------------------------- bookkeeping
    def keep(self, counts: torch.Tensor, nodes: torch.Tensor | None = None) -> None:
        """Commit staged tokens: row ``b`` keeps ``counts[b]`` of the last staged block.

        Args:
            counts: ``[B]`` how many staged tokens each row keeps.
            nodes: ``[B, M]`` which staged tokens (indices into the staged block, increasing), or None for the first
                ``counts[b]`` ones (a chain: no copy). Entries past ``counts[b]`` are ignored.
        """
        if nodes is not None and nodes.shape[1] > 0:
            m = nodes.shape[1]
            base = self.lengths[:, None]
            src = (base + nodes.clamp(min=0))[:, None, :, None]
            dst = (base + torch.arange(m, device=nodes.device))[:, None, :, None]
            for buf in (*self.keys, *self.values):
                src_i, dst_i = src.to(buf.device), dst.to(buf.device)
                shape = (buf.shape[0], buf.shape[1], m, buf.shape[3])
                buf.scatter_(2, dst_i.expand(shape), buf.gather(2, src_i.expand(shape)))
        self.lengths = self.lengths + counts.to(self.lengths.device)
        self._write_index = self._write_start = None

    def crop(self, lengths: torch.Tensor) -> None:  # type: ignore[override]
        """Truncate row ``b`` to ``min(L_b, lengths[b])`` committed tokens (``lengths [B]``)."""
        self.lengths = torch.minimum(self.lengths, lengths.to(self.lengths.device))

    def select_rows(self, rows: torch.Tensor) -> None:
        """Keep only ``rows [B']`` (indices into the current batch), in that order."""
        self.lengths = self.lengths[rows.to(self.lengths.device)]
        self.keys = [k[rows.to(k.device)] for k in self.keys]
        self.values = [v[rows.to(v.device)] for v in self.values]
        self._write_index = self._write_start = None

    def snapshot(self) -> dict[str, object]:
        """A copy of the whole state (for exploring alternatives and rolling back with :meth:`restore`)."""
        return {
            "lengths": self.lengths.clone(),
            "keys": [k.clone() for k in self.keys],
            "values": [v.clone() for v in self.values],
            "capacity": self.capacity,
        }

    def restore(self, snapshot: dict[str, object]) -> None:
        """Return to a state taken by :meth:`snapshot`."""
        self.lengths = snapshot["lengths"].clone()  # type: ignore[union-attr]
        self.keys = [k.clone() for k in snapshot["keys"]]  # type: ignore[union-attr]
        self.values = [v.clone() for v in snapshot["values"]]  # type: ignore[union-attr]
        self.capacity = snapshot["capacity"]  # type: ignore[assignment]
        self._write_index = self._write_start = None

    def reset(self) -> None:
        self.lengths.zero_()
        self._write_index = self._write_start = None

    def _grow(self, capacity: int) -> None:
        def grown(buf: torch.Tensor) -> torch.Tensor:
            out = buf.new_zeros(buf.shape[:2] + (capacity,) + buf.shape[3:])
            out[:, :, : buf.shape[2]] = buf
            return out

        self.keys = [grown(k) for k in self.keys]
        self.values = [grown(v) for v in self.values]
        self.capacity = capacity

    def __repr__(self) -> str:
        return f"KVCache(batch={self.batch_size}, capacity={self.capacity}, lengths={self.lengths.tolist()})"
