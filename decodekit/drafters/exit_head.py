"""A trained early exit (:class:`ExitHead`) and its file: the adapter that maps the target's state after layer ``L``
to its final one, so the first ``L`` layers draft what the whole model would say (Kangaroo, Liu et al., NeurIPS'24,
arXiv 2404.18911; LayerSkip's early-exit loss, arXiv 2404.16710, trains the same mapping into the model instead).
The drafter that runs it is :class:`~decodekit.drafters.EarlyExitDrafter` (``exit_head=``); the recipe that trains
it, :mod:`decodekit.train.exit_head`.

Faithfulness: Kangaroo's adapter is one attention layer with two norms over the shallow states of the whole
context; this one is position-wise (a residual MLP), because the target's own first ``L`` layers have already
attended over the context in the target's KV cache, and a position-wise head needs no cache of its own. The loss is
Kangaroo's: cross-entropy to the target's own next-token distribution (here over the draft vocabulary).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from decodekit.drafters.head_files import load_tensors, on_target, read_head, save_head
from decodekit.errors import ConfigError
from decodekit.models.base import LanguageModel
from decodekit.resources import shipped_weights

DEFAULT_WEIGHTS = "exit_head_smollm2-135m-instruct.safetensors"  # the zoo target's exit head (docs/training.md)
RETRAIN = "python -m decodekit train recipe=exit_head (docs/training.md)"


def default_weights() -> Path:
    """The exit head shipped for the zoo's ``smollm2-135m-instruct``."""
    return shipped_weights(DEFAULT_WEIGHTS)


class ExitHead(nn.Module):
    """``g = n + W_2 SiLU(W_1 n + b_1) + b_2`` on ``n``, the target's final norm of its state after layer ``L``.

    ``W_2`` and ``b_2`` start at zero, so an untrained head is the target's own untrained exit (``head(n)``). The
    draft logits are the target's output head over ``vocab`` (:class:`~decodekit.drafters.head_files.TrimmedHead`).

    Args:
        hidden: the target's hidden size ``H``.
        width: the MLP's inner width.
        exit_layer: the layer ``L`` whose output it reads (1-based), kept in the file.
        vocab: ``[V_d]`` the token ids the head scores.
    """

    def __init__(self, hidden: int, width: int, exit_layer: int, vocab: torch.Tensor) -> None:
        super().__init__()
        self.up, self.down = nn.Linear(hidden, width), nn.Linear(width, hidden)
        nn.init.zeros_(self.down.weight)
        nn.init.zeros_(self.down.bias)
        self.exit_layer = exit_layer
        self.register_buffer("vocab", vocab.long())

    def forward(self, n: torch.Tensor) -> torch.Tensor:
        """``n [..., H]`` -> ``g [..., H]``, the output head's input."""
        return n + self.down(nn.functional.silu(self.up(n)))

    def save(self, path: str | Path, metadata: dict[str, Any]) -> None:
        """Write the weights (float16), the vocabulary, and ``metadata`` with the exit layer and width added."""
        save_head(self, path, {**metadata, "exit_layer": self.exit_layer, "width": self.up.out_features})


def load_exit_head(path: str | Path, target: LanguageModel) -> tuple[ExitHead, dict[str, Any]]:
    """The exit head in ``path`` for ``target`` (on its device and dtype, with its CPU
    kernels: :func:`~decodekit.kernels.match_kernels`) and its metadata; refuses a head trained
    for another target or a file that is not an exit head."""
    meta, tensors = read_head(path, target, "an exit head", RETRAIN)
    if "exit_layer" not in meta or "width" not in meta or "vocab" not in tensors:
        raise ConfigError(f"{path} is not an exit head file (no exit_layer / width / vocab); train one with {RETRAIN}")
    try:
        head = ExitHead(int(meta["hidden_size"]), int(meta["width"]), int(meta["exit_layer"]), tensors["vocab"])
    except Exception as error:  # a width or layer that is no integer, a negative width
        raise ConfigError(
            f"{path}: its metadata does not describe an exit head ({error}); train one with {RETRAIN}"
        ) from None
    load_tensors(head, tensors, path, "an exit head", RETRAIN)
    return on_target(head, target), meta
