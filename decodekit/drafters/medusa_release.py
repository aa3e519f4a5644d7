"""Medusa-1 heads as their authors release them (``FasterDecoding/medusa-vicuna-7b-v1.3`` and the like): a
directory holding ``config.json`` (``medusa_num_heads``, ``medusa_num_layers``, ``base_model_name_or_path``) and
``medusa_lm_head.pt`` or ``medusa_lm_head.safetensors``, the state of Medusa's ``medusa_head``: per head ``i``,
``medusa_num_layers`` residual blocks ``{i}.{j}.linear.weight / .bias`` (``x + SiLU(W x + b)``), then the head's own
output layer ``{i}.{L}.weight [V, H]`` over the full vocabulary.

Faithfulness: the forward of ``MedusaModel.medusa_head`` (FasterDecoding/Medusa ``medusa/model/medusa_model.py``):
each head's blocks in order, then its output layer, on the target's final (normed) hidden state at the last committed
position. The reference builds ``[ResBlock(H)] * L``, one block repeated, so its files hold the same tensors under
every ``j``; the blocks are applied here as the file names them, which is the same thing. ``tests/unit/test_medusa.py``
checks the first round's draft against a port of that module and greedy output against plain decoding. ``.pt`` files
are read with ``torch.load(weights_only=True)``: no pickled code runs.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch
from torch import nn

from decodekit.drafters.head_files import target_config
from decodekit.errors import ConfigError
from decodekit.models.base import LanguageModel
from decodekit.models.checkpoint_files import read_state

FILES = ("medusa_lm_head.safetensors", "medusa_lm_head.pt")


def release_file(path: str | Path) -> Path | None:
    """The head file of a Medusa-1 release at ``path`` (the directory, or the file itself), or None when ``path``
    is not one."""
    path = Path(path)
    if path.is_dir():
        return next((path / f for f in FILES if (path / f).is_file()), None)
    return path if path.name in FILES and path.is_file() else None


class ReleasedMedusaHeads(nn.Module):
    """``K`` Medusa-1 heads, each ``L`` residual blocks and its own output layer.

    Args:
        weight: ``[K, L, H, H]`` the blocks' weights; bias: ``[K, L, H]``.
        out: ``[K, V, H]`` each head's output layer.
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor, out: torch.Tensor) -> None:
        super().__init__()
        self.weight, self.bias, self.out = nn.Parameter(weight), nn.Parameter(bias), nn.Parameter(out)
        self.register_buffer("vocab", torch.arange(out.shape[1]))

    @property
    def num_heads(self) -> int:
        return self.weight.shape[0]

    def forward(self, f: torch.Tensor) -> torch.Tensor:
        """``f [B, H]`` -> ``[B, K, H]``: each head's feature before its output layer."""
        h = f[:, None, :].expand(-1, self.num_heads, -1)
        for j in range(self.weight.shape[1]):
            h = h + nn.functional.silu(torch.einsum("bkh,koh->bko", h, self.weight[:, j]) + self.bias[:, j])
        return h

    def scores(self, h: torch.Tensor) -> torch.Tensor:
        """``h [B, k, H]`` (the first ``k`` heads' features) -> ``[B, k, V]`` float32 logits of each head's own
        output layer."""
        return torch.einsum("bkh,kvh->bkv", h, self.out[: h.shape[1]]).float()


def load_release(path: str | Path, target: LanguageModel) -> ReleasedMedusaHeads:
    """The Medusa-1 heads at ``path`` (a release directory or its head file) for ``target``.

    Raises:
        ConfigError: no head file, tensors missing for a head or block the config names, or heads for another
            target (hidden size or vocabulary; both shapes named).
    """
    file = release_file(path)
    if file is None:
        raise ConfigError(f"no Medusa-1 head file in {path}: expected one of {', '.join(FILES)}")
    tensors = read_state(file)
    found = sorted({int(m[1]) for k in tensors if (m := re.match(r"(\d+)\.", k))})
    config_file = file.parent / "config.json"
    config = json.loads(config_file.read_text()) if config_file.is_file() else {}
    heads = int(config.get("medusa_num_heads") or len(found))
    layers = int(config.get("medusa_num_layers") or sum(f"0.{j}.linear.weight" in tensors for j in range(64)))
    if layers > 1 and not any(re.match(r"\d+\.[1-9]\d*\.linear\.", k) for k in tensors):
        # the reference repeats one block ([ResBlock] * L: shared tensors), which safetensors' save_model keeps once
        shared = {f"{i}.{j}.linear.{p}": f"{i}.0.linear.{p}" for i in range(heads) for j in range(1, layers)
                  for p in ("weight", "bias")}  # fmt: skip
        tensors = {**tensors, **{k: tensors[v] for k, v in shared.items() if v in tensors}}
    try:
        weight = torch.stack(
            [torch.stack([tensors[f"{i}.{j}.linear.weight"] for j in range(layers)]) for i in range(heads)]
        )
        bias = torch.stack(
            [torch.stack([tensors[f"{i}.{j}.linear.bias"] for j in range(layers)]) for i in range(heads)]
        )
        out = torch.stack([tensors[f"{i}.{layers}.weight"] for i in range(heads)])
    except KeyError as error:
        raise ConfigError(
            f"{file} lacks {error.args[0]!r}: config.json names {heads} heads of {layers} residual blocks each "
            f"(medusa_num_heads, medusa_num_layers); the file holds heads {found}"
        ) from None
    hidden, vocab = int(target_config(target, "medusa").hidden_size), int(target.vocab_size)
    if out.shape[1:] != (vocab, hidden):
        raise ConfigError(
            f"the Medusa heads at {path} were trained for another target: their output layers are "
            f"{tuple(out.shape[1:])} (vocabulary x hidden), the target's are {(vocab, hidden)}; pass heads released "
            "for this model"
        )
    dtype = getattr(target, "dtype", torch.float32)
    return ReleasedMedusaHeads(weight, bias, out).to(device=target.device, dtype=dtype).eval().requires_grad_(False)
