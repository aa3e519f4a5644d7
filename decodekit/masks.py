"""Attention masks and position ids, for every way decodekit runs a model.

All masks are boolean ``[B, 1, N, S]``: ``True`` where query ``i`` (of the ``N`` tokens being run) may attend to
key ``s``. Keys are cache slots (see :mod:`decodekit.cache`): slot ``s`` holds the token at position ``s``; slot
``s < L_b`` holds committed token ``s`` of row ``b`` (``L_b`` = committed length). Every query row attends to at
least itself (padded queries too), so SDPA never produces NaNs.

Two kinds of helpers:

- fast paths for the speculative loop, the new tokens staged at slots ``L_b .. L_b + N - 1``: :func:`chain_mask`
  (causal) and :func:`tree_mask` (a token tree, see :func:`tree_ancestors`);
- a :class:`KeyLayout` saying which position each key holds and which keys are usable, built for each way of running
  a forward (:func:`staged_layout` after ``cache.stage``, :func:`write_at_layout` after ``cache.write_at``,
  :func:`attend_layout` after ``cache.attend``; they live in :mod:`decodekit.cache.layout`, importable from here
  too), and one function per attention pattern over any layout:
  :func:`causal_mask`, :func:`bidirectional_mask` (a stock decoder run as a masked diffusion LM),
  :func:`block_causal_mask` (block diffusion: bidirectional within a block, causal across blocks) and
  :func:`prefix_mask` (prefix LM). Each returns ``(mask [B, 1, N, S], positions [B, N])``. Whether a key may be seen
  depends only on its position and the query's, so a cached run equals an uncached run under the same pattern
  whenever the cached K/V were computed under it too.
"""

from __future__ import annotations

import math

import torch

from decodekit.cache.layout import KeyLayout as KeyLayout
from decodekit.cache.layout import attend_layout as attend_layout
from decodekit.cache.layout import staged_layout as staged_layout
from decodekit.cache.layout import write_at_layout as write_at_layout


def tree_ancestors(parents: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Ancestor-or-self relation of a batched token tree.

    Args:
        parents: ``[B, N]`` parent index per node, ``-1`` for roots, ``parents[:, i] < i``.
        valid: ``[B, N]`` bool; invalid nodes are isolated (related only to themselves).

    Returns:
        ``[B, N, N]`` bool, ``out[b, i, j]`` iff j == i or j is an ancestor of i.
    """
    batch, n = parents.shape
    eye = torch.eye(n, dtype=torch.bool, device=parents.device).expand(batch, n, n)
    if n == 0:
        return eye.clone()
    has_parent = valid & (parents >= 0)
    step = torch.zeros(batch, n, n, dtype=torch.float32, device=parents.device)
    step.scatter_(2, parents.clamp(min=0)[..., None], has_parent[..., None].float())
    closure = eye.float() + step
    # Transitive closure by repeated squaring: after k squarings, paths of length < 2^k are covered.
    for _ in range(max(1, math.ceil(math.log2(n)))):
        closure = (closure @ closure).clamp_(max=1.0)
    return closure.bool()


def chain_mask(past_lengths: torch.Tensor, num_new: int, kv_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Causal mask and positions for appending ``num_new`` tokens per row after ``past_lengths`` committed ones.

    Args:
        past_lengths: ``[B]`` committed length per row.
        num_new: ``N`` tokens run per row (ragged rows are right-padded; padding attends causally, harmlessly).
        kv_len: ``S`` key slots visible to the forward (at least ``max(past_lengths) + N``).

    Returns:
        ``mask [B, 1, N, S]`` bool and ``positions [B, N]`` (``L_b + i``).
    """
    slots = torch.arange(kv_len, device=past_lengths.device)
    positions = past_lengths[:, None]  # [B, N]
    if num_new > 1:
        positions = positions + torch.arange(num_new, device=past_lengths.device)
    mask = slots[None, None, :] <= positions[:, :, None]  # [B, N, S]: everything up to and including itself
    return mask[:, None], positions


def tree_mask(past_lengths: torch.Tensor, ancestors: torch.Tensor, kv_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Tree attention mask and depth-based positions.

    Args:
        past_lengths: ``[B]`` committed length per row.
        ancestors: ``[B, N, N]`` ancestor-or-self relation of the ``N`` nodes being run (see :func:`tree_ancestors`),
            where node 0 is usually the pending token.
        kv_len: ``S`` key slots visible to the forward.

    Returns:
        ``mask [B, 1, N, S]`` bool and ``positions [B, N]`` = ``L_b + depth - 1`` (roots sit at ``L_b``).
    """
    batch, n, _ = ancestors.shape
    slots = torch.arange(kv_len, device=past_lengths.device)
    rel = slots[None, :] - past_lengths[:, None]  # [B, S]: index into the new block, negative = committed
    in_block = (rel >= 0) & (rel < n)
    block = ancestors.gather(2, rel.clamp(0, max(n - 1, 0))[:, None, :].expand(batch, n, kv_len))
    mask = (rel < 0)[:, None, :] | (block & in_block[:, None, :])
    positions = past_lengths[:, None] + ancestors.sum(-1) - 1
    return mask[:, None], positions


def windowed(mask: torch.Tensor, positions: torch.Tensor, key_positions: torch.Tensor, window: int) -> torch.Tensor:
    """Restrict ``mask [B, 1, N, S]`` to keys less than ``window`` positions away (sliding-window attention).

    transformers' sliding layers let query position ``q`` see key position ``k`` when ``q - k < window`` (on top of
    causality); the distance is taken both ways here, which is the same on any causal mask and keeps a
    bidirectional use of a stock decoder local too. Each query keeps its own key (distance 0).

    Args:
        mask: the forward's mask.
        positions: ``[B, N]`` query positions.
        key_positions: ``[B, S]`` position of the token at each key (``KVCache.key_positions``).
        window: the window size ``W >= 1``.
    """
    distance = (positions[:, :, None] - key_positions[:, None, :]).abs()  # [B, N, S]
    return mask & (distance < window)[:, None]


def chunked(mask: torch.Tensor, positions: torch.Tensor, key_positions: torch.Tensor, chunk: int) -> torch.Tensor:
    """Restrict ``mask [B, 1, N, S]`` to keys in the query's chunk of ``chunk`` positions (chunked attention, as
    Llama 4's local layers: position ``p`` is in chunk ``p // chunk``). Shapes as :func:`windowed`."""
    same = (positions[:, :, None] // chunk) == (key_positions[:, None, :] // chunk)
    return mask & same[:, None]


def add_root(ancestors: torch.Tensor) -> torch.Tensor:
    """Prepend the pending token as node 0, the root every draft node descends from.

    Args:
        ancestors: ``[B, N, N]`` ancestor-or-self relation of the draft nodes.

    Returns:
        ``[B, N + 1, N + 1]`` the same relation over ``[pending] + nodes``.
    """
    batch, n, _ = ancestors.shape
    out = torch.zeros(batch, n + 1, n + 1, dtype=torch.bool, device=ancestors.device)
    out[:, :, 0] = True
    out[:, 1:, 1:] = ancestors
    return out


def to_additive(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Boolean mask -> additive float mask (0 where allowed, the dtype's minimum elsewhere), for eager attention."""
    out = torch.zeros(mask.shape, dtype=dtype, device=mask.device)
    return out.masked_fill_(~mask, torch.finfo(dtype).min)


# ------------------------------------------------------------------------------------- attention patterns
def _mask(keys: KeyLayout, allowed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``allowed [B, N, S]`` (or broadcastable) AND usable keys, plus each query's own key."""
    batch, n = keys.positions.shape
    mask = (allowed & keys.usable[:, None, :]).expand(batch, n, keys.usable.shape[1]).clone()
    mask.scatter_(2, keys.own[..., None], True)
    return mask[:, None], keys.positions


def causal_mask(keys: KeyLayout) -> tuple[torch.Tensor, torch.Tensor]:
    """Each query sees the usable keys at positions up to its own.

    Returns:
        ``mask [B, 1, N, S]`` bool and ``positions [B, N]``.
    """
    return _mask(keys, keys.key_positions[:, None, :] <= keys.positions[:, :, None])


def bidirectional_mask(keys: KeyLayout) -> tuple[torch.Tensor, torch.Tensor]:
    """Every query sees every usable key (a stock causal decoder run as a masked diffusion LM).

    Returns:
        ``mask [B, 1, N, S]`` bool and ``positions [B, N]``.
    """
    return _mask(keys, torch.ones((), dtype=torch.bool, device=keys.usable.device))


def block_causal_mask(
    keys: KeyLayout, block_size: int, *, origin: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Bidirectional within a block, causal across blocks (block diffusion, dKV block-causal models).

    Position ``p`` of row ``b`` is in block ``floor((p - origin[b]) / block_size)``; a query sees the usable keys in
    its own and earlier blocks.

    Args:
        keys: the forward's key layout.
        block_size: tokens per block.
        origin: ``[B]`` a position where a block starts (e.g. the prompt length); None = 0.

    Returns:
        ``mask [B, 1, N, S]`` bool and ``positions [B, N]``.
    """
    shift = 0 if origin is None else origin.to(keys.positions.device)[:, None]
    key_block = torch.div(keys.key_positions - shift, block_size, rounding_mode="floor")
    query_block = torch.div(keys.positions - shift, block_size, rounding_mode="floor")
    return _mask(keys, key_block[:, None, :] <= query_block[:, :, None])


def prefix_mask(keys: KeyLayout, prefix_lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Prefix LM: bidirectional over positions ``< prefix_lengths[b]`` (the prompt), causal after.

    Args:
        keys: the forward's key layout.
        prefix_lengths: ``[B]`` prefix length per row.

    Returns:
        ``mask [B, 1, N, S]`` bool and ``positions [B, N]``.
    """
    prefix = prefix_lengths.to(keys.positions.device)[:, None, None]
    in_prefix = keys.key_positions[:, None, :] < prefix
    return _mask(keys, in_prefix | (keys.key_positions[:, None, :] <= keys.positions[:, :, None]))
