"""Key layouts: which token each key of a forward holds, and which keys hold usable K/V, for each way a
:class:`~decodekit.cache.KVCache` plans a forward (:func:`staged_layout` after ``cache.stage``, :func:`write_at_layout`
after ``cache.write_at``, :func:`attend_layout` after ``cache.attend``). The attention patterns of
:mod:`decodekit.masks` (:func:`~decodekit.masks.causal_mask`, ...) take a :class:`KeyLayout`; the names are also
importable from there."""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["KeyLayout", "attend_layout", "staged_layout", "write_at_layout"]


@dataclass(frozen=True, eq=False)
class KeyLayout:
    """Which token each key of a forward holds, and which keys hold usable K/V.

    Attributes:
        key_positions: ``[B, S]`` position of the token whose K/V sit at each key index.
        usable: ``[B, S]`` bool: the key holds K/V a query may attend (a valid cached slot or a real new token).
        positions: ``[B, N]`` position of each new token (the forward's ``position_ids``).
        own: ``[B, N]`` key index of each new token's own K/V (a padded query's only key).
    """

    key_positions: torch.Tensor
    usable: torch.Tensor
    positions: torch.Tensor
    own: torch.Tensor


def _real(counts: torch.Tensor | None, num_new: int, like: torch.Tensor) -> torch.Tensor:
    """``[B, N]`` bool: which of the ``N`` new tokens are real (``j < counts[b]``; all when counts is None)."""
    if counts is None:
        return torch.ones(len(like), num_new, dtype=torch.bool, device=like.device)
    return torch.arange(num_new, device=like.device)[None, :] < counts.to(like.device)[:, None]


def staged_layout(
    past_lengths: torch.Tensor,
    num_new: int,
    kv_len: int,
    *,
    offset: int = 0,
    counts: torch.Tensor | None = None,
    key_valid: torch.Tensor | None = None,
) -> KeyLayout:
    """Keys after ``S = cache.stage(num_new, offset)``: new token ``j`` at slot and position ``L_b + offset + j``.

    Args:
        past_lengths: ``[B]`` committed lengths ``L_b``.
        num_new: ``N`` new tokens per row.
        kv_len: ``S``.
        offset: the staged block's offset; slots ``L_b .. L_b + offset - 1`` (earlier staged tokens) are usable.
        counts: ``[B]`` real new tokens per row (the rest are padding, invisible to other queries); None = all.
        key_valid: ``[B, S]`` which cached slots are valid (``cache.key_mask(S)``); None = ``slot < L_b``.
    """
    slots = torch.arange(kv_len, device=past_lengths.device)[None, :]
    start = past_lengths[:, None] + offset
    rel = slots - start  # [B, S]: index into the new block, negative = before it
    cached = slots < past_lengths[:, None] if key_valid is None else key_valid.to(slots.device)
    staged_before = (slots >= past_lengths[:, None]) & (rel < 0)
    real = _real(counts, num_new, past_lengths)
    new_real = real.gather(1, rel.clamp(0, max(num_new - 1, 0))) & (rel >= 0) & (rel < num_new)
    usable = (cached & ((rel < 0) | (rel >= num_new))) | staged_before | new_real
    positions = start + torch.arange(num_new, device=slots.device)
    return KeyLayout(slots.expand(len(past_lengths), kv_len), usable, positions, positions)


def write_at_layout(slots: torch.Tensor, key_valid: torch.Tensor) -> KeyLayout:
    """Keys after ``S = cache.write_at(slots)``: new token ``j`` overwrites slot ``slots[b, j]``, its position.

    Args:
        slots: ``[B, M]`` written slots, ``-1`` = padding (position 0; attends only key 0).
        key_valid: ``[B, S]`` which slots hold valid K/V (``cache.key_mask(S)``, which includes the written slots).
    """
    batch, kv_len = key_valid.shape
    keys = torch.arange(kv_len, device=key_valid.device)
    slots = slots.to(key_valid.device)
    written = (slots[:, :, None] == keys).any(1)  # [B, S]; padding (-1) matches nothing
    positions = slots.clamp(min=0)
    return KeyLayout(keys.expand(batch, kv_len), key_valid | written, positions, positions)


def attend_layout(
    past_lengths: torch.Tensor,
    num_new: int,
    cached_len: int,
    *,
    positions: torch.Tensor | None = None,
    counts: torch.Tensor | None = None,
    key_valid: torch.Tensor | None = None,
) -> KeyLayout:
    """Keys after ``S = cache.attend(num_new, cached_len)``: cached slots ``0 .. S_c - 1``, then the new tokens.

    New token ``j`` sits at key index ``S_c + j``. A row shorter than ``S_c`` has its gap masked out.

    Args:
        past_lengths: ``[B]`` committed lengths ``L_b``.
        num_new: ``N`` new tokens per row.
        cached_len: ``S_c`` (the ``S - N`` of ``cache.attend``).
        positions: ``[B, N]`` positions of the new tokens; None = ``L_b + j``.
        counts: ``[B]`` real new tokens per row (the rest are padding, invisible to other queries); None = all.
        key_valid: ``[B, S_c]`` which cached slots are valid (``cache.key_mask(S_c)``); None = ``slot < L_b``.
    """
    device = past_lengths.device
    batch = len(past_lengths)
    cached_slots = torch.arange(cached_len, device=device)[None, :]
    if positions is None:
        positions = past_lengths[:, None] + torch.arange(num_new, device=device)
    cached = cached_slots < past_lengths[:, None] if key_valid is None else key_valid.to(device)
    key_positions = torch.cat([cached_slots.expand(batch, cached_len), positions], 1)
    usable = torch.cat([cached, _real(counts, num_new, past_lengths)], 1)
    own = (cached_len + torch.arange(num_new, device=device)).expand(batch, num_new)
    return KeyLayout(key_positions, usable, positions, own)
