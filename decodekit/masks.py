"""Attention masks and position ids, for every way decodekit runs a model.

All masks are boolean ``[B, 1, N, S]``: ``True`` where query ``i`` (of the ``N`` tokens being run) may attend to
key slot ``s`` of the cache. Slot ``s < L_b`` holds committed token ``s`` of row ``b`` (``L_b`` = committed length);
the ``N`` new tokens are written to slots ``L_b .. L_b + N - 1``. Every query row attends to at least itself, so
padded queries never produce NaNs in SDPA.
"""

from __future__ import annotations

import math

import torch


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
