"""The target's hidden states of chosen layers at every position of the cached feature-head sequences
(:mod:`decodekit.train.feature_data`), computed once and cached next to them: EAGLE-3's fused low / middle / high
features (:mod:`decodekit.train.eagle3`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch


@torch.no_grad()
def layer_states(target: Any, tokens: torch.Tensor, layers: Sequence[int]) -> torch.Tensor:
    """``[B, L, len(layers) * H]``: the outputs of ``layers`` (1-based, ascending) at every position of the
    right-padded ``tokens [B, L]``, concatenated in that order (the target runs up to the last of them only)."""
    from decodekit.train.acceptance_data import _forward

    empty = torch.zeros(tokens.shape[0], 0, dtype=torch.long)
    out = _forward(target, tokens, empty, False, hidden_layers=tuple(layers), exit_layer=max(layers))
    return torch.cat([out.hidden[i] for i in layers], -1)


@torch.no_grad()
def final_and_layer_states(
    target: Any, tokens: torch.Tensor, layers: Sequence[int]
) -> tuple[torch.Tensor, torch.Tensor]:
    """One forward of the right-padded ``tokens [B, L]`` (on the target's device): the final (normed) features
    ``[B, L, H]`` and :func:`layer_states` ``[B, L, len(layers) * H]``, what a training step needs when it computes
    them per batch instead of reading a cache."""
    from decodekit.train.acceptance_data import _forward

    empty = tokens.new_zeros(tokens.shape[0], 0)
    out = _forward(target, tokens, empty, True, hidden_layers=tuple(layers))
    return out.last_hidden, torch.cat([out.hidden[i] for i in layers], -1)


@torch.no_grad()
def final_states(target: Any, tokens: torch.Tensor) -> torch.Tensor:
    """One forward of the right-padded ``tokens [B, L]`` (on the target's device): the final (normed) features
    ``[B, L, H]``: the cached features' pass (:func:`~decodekit.train.feature_data.target_features`), and what an
    EAGLE-1, Medusa or exit-head step computes per batch (``online``) instead of reading that cache."""
    from decodekit.train.acceptance_data import _forward

    return _forward(target, tokens, tokens.new_zeros(tokens.shape[0], 0), True).last_hidden


def cached_layer_states(
    target: Any,
    tokens: torch.Tensor,
    lengths: torch.Tensor,
    layers: Sequence[int],
    data_dir: Path,
    batch_size: int,
    progress: bool,
) -> torch.Tensor:
    """:func:`layer_states` of every row of ``tokens [N, L]`` (float16 ``[N, L, len(layers) * H]``, zero past each
    row's ``lengths [N]``: computed in length-sorted batches, :func:`~decodekit.train.feature_data.by_length`), read
    from ``data_dir/layers_<a>-<b>-<c>.pt`` when a run wrote them for these rows (or more: a run on all the sequences
    serves one on the responses only), else computed and written there."""
    from decodekit.train.feature_data import by_length

    name = layers_file(data_dir, layers)
    if name.is_file():
        cached = torch.load(name)
        index = {tuple(row.tolist()): i for i, row in enumerate(cached["tokens"])}
        rows = [index.get(tuple(row.tolist())) for row in tokens]
        if cached["tokens"].shape[1] == tokens.shape[1] and None not in rows:
            return cached["states"][torch.tensor(rows, dtype=torch.long)]
    out = by_length(tokens, lengths, batch_size, lambda t, x: layer_states(t, x, layers), target, "target layer states",
                    progress)  # fmt: skip
    save_layer_states(data_dir, tokens, layers, out)
    return out


def layers_file(data_dir: Path, layers: Sequence[int]) -> Path:
    """Where :func:`cached_layer_states` keeps the states of ``layers``: ``data_dir/layers_<a>-<b>-<c>.pt``."""
    return Path(data_dir) / f"layers_{'-'.join(map(str, layers))}.pt"


def save_layer_states(data_dir: Path, tokens: torch.Tensor, layers: Sequence[int], states: torch.Tensor) -> None:
    """Cache ``states [N, L, len(layers) * H]`` of the rows ``tokens [N, L]`` where :func:`cached_layer_states`
    reads them (the features pass writes them too when a recipe asks for both in one forward)."""
    torch.save({"tokens": tokens, "layers": list(layers), "states": states}, layers_file(data_dir, layers))
