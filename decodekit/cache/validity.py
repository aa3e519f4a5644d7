"""Per-slot validity of a :class:`~decodekit.cache.KVCache`: which slots hold K/V a query may attend.

By default validity is implicit, ``valid[b, s] = s < L_b`` (the committed slots), and costs nothing. It becomes an
explicit ``[B, S_cap + 1]`` bool tensor (the last column is a scratch slot) the first time a slot is marked or
invalidated on its own: a diffusion sampler's dual cache keeps a cached suffix block past ``L_b`` with uncached slots
before it, and dKV-style caches invalidate committed slots whose K/V are stale. Once explicit, every cache op keeps
it consistent (a staged write invalidates its slots until kept, a keep validates the committed ones, a crop
invalidates what it drops).
"""

from __future__ import annotations

import torch


class SlotValidity:
    """Optional ``[B, S_cap + 1]`` validity of a cache's slots; ``None`` while it equals ``slot < L_b``."""

    def __init__(self) -> None:
        self.mask: torch.Tensor | None = None

    @property
    def explicit(self) -> bool:
        return self.mask is not None

    def _slots(self, lengths: torch.Tensor) -> torch.Tensor:
        assert self.mask is not None
        return torch.arange(self.mask.shape[1], device=lengths.device)[None, :]  # [1, S_cap + 1]

    def materialize(self, lengths: torch.Tensor, capacity: int) -> torch.Tensor:
        """Make validity explicit (``slot < L_b``) if it is not; returns ``[B, S_cap + 1]``."""
        if self.mask is None:
            self.mask = torch.arange(capacity + 1, device=lengths.device)[None, :] < lengths[:, None]
        return self.mask

    def key_mask(self, lengths: torch.Tensor, kv_len: int) -> torch.Tensor:
        """``[B, kv_len]`` bool, True where the slot holds valid K/V (a copy)."""
        if self.mask is None:
            return torch.arange(kv_len, device=lengths.device)[None, :] < lengths[:, None]
        out = self.mask.new_zeros(self.mask.shape[0], kv_len)
        width = min(kv_len, self.mask.shape[1] - 1)  # slots past the capacity are never valid
        out[:, :width] = self.mask[:, :width]
        return out

    def set(self, lengths: torch.Tensor, capacity: int, slots: torch.Tensor, value: bool) -> None:
        """Mark ``slots [B, M]`` (``-1`` = padding, ignored) valid or invalid."""
        mask = self.materialize(lengths, capacity)
        index = slots.to(mask.device)
        index = index.where(index >= 0, capacity)  # padding writes the scratch column
        mask.scatter_(1, index, value)
        mask[:, capacity] = False

    def staged(self, lengths: torch.Tensor, offset: int, num_new: int) -> None:
        """A staged forward overwrites slots ``L_b + offset .. L_b + offset + num_new - 1``: invalid until kept."""
        if self.mask is not None:
            rel = self._slots(lengths) - (lengths[:, None] + offset)
            self.mask &= (rel < 0) | (rel >= num_new)

    def kept(self, old_lengths: torch.Tensor, counts: torch.Tensor) -> None:
        """Slots ``old L_b .. old L_b + counts[b] - 1`` were committed."""
        if self.mask is not None:
            rel = self._slots(old_lengths) - old_lengths[:, None]
            self.mask |= (rel >= 0) & (rel < counts[:, None])

    def cropped(self, old_lengths: torch.Tensor, new_lengths: torch.Tensor) -> None:
        """Slots ``new L_b .. old L_b - 1`` were dropped."""
        if self.mask is not None:
            slots = self._slots(old_lengths)
            self.mask &= (slots < new_lengths[:, None]) | (slots >= old_lengths[:, None])

    def select_rows(self, rows: torch.Tensor) -> None:
        if self.mask is not None:
            self.mask = self.mask[rows.to(self.mask.device)]

    def grow(self, capacity: int) -> None:
        if self.mask is not None:
            out = self.mask.new_zeros(self.mask.shape[0], capacity + 1)
            out[:, : self.mask.shape[1] - 1] = self.mask[:, :-1]
            self.mask = out

    def copy(self) -> torch.Tensor | None:
        return None if self.mask is None else self.mask.clone()
