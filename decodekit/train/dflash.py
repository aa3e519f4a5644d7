"""Train a DFlash head for a target (``python -m decodekit train recipe=dflash``, docs/training.md): the ``dflash``
drafter (:mod:`decodekit.drafters.dflash`).

Self-distillation on the feature heads' cached sequences (:mod:`decodekit.train.feature_data`; point ``data_dir`` at
an EAGLE run's ``data`` to reuse them), on the shared runner (:func:`~decodekit.train.recipe.run_recipe`). Each
step samples ``anchors`` positions ``a`` per sequence inside its response; at each, a block of ``block_size`` slots
(the token at ``a``, then mask slots at ``a + 1 ..``) attends to the fused target features of positions ``< a``
(KV injection) and to its own slots, all blocks of a sequence in one forward under one mask (:func:`block_mask`).
Slot ``j`` learns the target's own distribution of the token at ``a + j`` (``softmax(W_d f_{a+j-1})``, soft
cross-entropy over the ``train_vocab`` most frequent tokens), weighted ``exp(-(j - 1) / gamma)`` as in the DFlash
paper's position decay; the target, its embedding and output head are frozen. The tapped layers' states are cached
once next to the data on the CPU (as the EAGLE-3 recipe's), computed per batch on a GPU (``online``).

Reconstructed from the paper (arXiv 2602.06036) and the released model's inference code (z-lab/dflash at 44947fb:
its training code is not public there): the anchors, the block layout and the decay follow the paper's
description; ours: the soft target (the paper trains on the target's generated tokens; the distribution carries
more per position), the learned mask embedding, the head started from the target's last layer.

Writes to ``out_dir``: ``data/`` (unless ``data_dir``), ``checkpoints/``, ``history.json``, ``summary.json``,
``loss.png`` and ``dflash_<base>.safetensors`` (pass it as ``weights=`` to the ``dflash`` drafter).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from decodekit.train.blocks import BlockConfig, BlockObjective, mean_accepted
from decodekit.train.recipe import run_recipe, shares

__all__ = ["block_mask", "block_outputs", "pick_vocab", "train"]


def block_mask(anchors: torch.Tensor, block: int, context: int) -> torch.Tensor:
    """``[B, 1, A * n, context + A * n]`` bool for ``anchors [B, A]`` and blocks of ``n = block`` slots: a slot of
    block ``i`` attends to the context positions before its anchor and to every slot of its own block."""
    batch, count = anchors.shape
    before = torch.arange(context, device=anchors.device)[None, None] < anchors[..., None]  # [B, A, T]
    before = before.repeat_interleave(block, 1)  # [B, A * n, T]
    own = torch.arange(count, device=anchors.device).repeat_interleave(block)
    same = (own[:, None] == own[None, :]).expand(batch, -1, -1)  # [B, A * n, A * n]
    return torch.cat([before, same], -1)[:, None]


def block_outputs(
    head: Any, embed: Any, tokens: torch.Tensor, taps: torch.Tensor, anchors: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The head's outputs ``[B, A, n - 1, H]`` at the mask slots of the blocks at ``anchors [B, A]`` over
    ``tokens [B, L]`` with the tapped states ``taps [B, L, k H]`` (all blocks of a row in one forward,
    :func:`block_mask`), and each slot's predicted position ``[B, A, n - 1]``."""
    n, (batch, count) = head.block_size, anchors.shape
    positions = torch.arange(tokens.shape[1], device=tokens.device).expand(batch, -1)
    past = head.context_kv(head.context(taps), positions)
    with torch.no_grad():
        first = embed(tokens.gather(1, anchors))  # [B, A, H]
    x = torch.cat([first[:, :, None], head.mask_embedding.expand(batch, count, n - 1, -1)], 2).flatten(1, 2)
    slots = (anchors[..., None] + torch.arange(n, device=tokens.device)).flatten(1)  # [B, A * n]
    out = head(x, slots, past, block_mask(anchors, n, tokens.shape[1])).unflatten(1, (count, n))[:, :, 1:]
    return out, slots.unflatten(1, (count, n))[:, :, 1:]


@torch.no_grad()
def pick_vocab(head: Any, target: Any, val: Any, sizes: Sequence[int], objective: BlockObjective) -> dict[str, Any]:
    """The draft vocabulary size whose held-out blocks have the longest mean greedy accepted prefix against the
    target's argmax over its whole vocabulary (the head's cost hardly depends on the size: the slots' scores are a
    small product next to the target's forward), with each size's. One head forward per batch serves every size."""
    from decodekit.drafters.head_files import head_rows
    from decodekit.train.layer_features import layer_states

    vocab = head.vocab.to(target.device)
    rows = head_rows(target, vocab[: max(sizes)])[0]  # the target's output rows, dense

    def outputs(tokens: torch.Tensor, anchors: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return block_outputs(head, target.embed, tokens, layer_states(target, tokens, head.target_layers), anchors)

    def hits(batch: Any) -> list[torch.Tensor]:
        scores = batch.out @ rows.T
        return [vocab[scores[..., :s].argmax(-1)] == batch.want for s in sizes]

    accept = dict(zip(sizes, mean_accepted(objective.held_out(target, val, outputs), hits, len(sizes))))
    return {"picked": max(sizes, key=lambda s: (accept[s], -s)), "accept": accept}


@shares(BlockConfig)
def train(
    out_dir: str | Path, *, layers: tuple[int, ...] | None = None, head_layers: int = 1, **shared: Any
) -> dict[str, Any]:
    """Train the head; returns the summary numbers (also in ``summary.json``). The recipe's own knobs: the target
    ``layers`` fused (1-based; None: DFlash's default for ``head_layers``) and ``head_layers``; ``shared``:
    :class:`~decodekit.train.blocks.BlockConfig`'s (``block_size``, ``anchors``, ``gamma`` among them).
    ``decodekit/recipes/train/dflash.yaml`` documents each."""
    cfg = BlockConfig.of("dflash", locals(), train_vocab=16384, vocab_sizes=(4096, 16384), epochs=2, lr=5e-4)
    objective = BlockObjective.of(cfg)
    from decodekit.drafters.dflash_head import DFlashHead, default_layers
    from decodekit.train.arguments import chosen_layers
    from decodekit.train.feature_heads import device_settings
    from decodekit.train.layer_features import cached_layer_states, layer_states

    picked: tuple[int, ...] = ()

    def check_target(target: Any) -> tuple[int, ...] | None:
        nonlocal picked
        picked = chosen_layers(layers, default_layers(target.num_layers, head_layers), target.num_layers)
        return None if online else picked  # cached: the features' forward keeps these layers' states too

    dev, online = device_settings(cfg.device, cfg.online, cfg.time_budget_s)
    cached: list[torch.Tensor] = []  # the tapped states of every sequence, when the features are cached (the CPU)

    def make_head(target: Any, data: Any) -> DFlashHead:
        if not online:  # once, as eagle3 caches its taps: a step then runs no target forward
            cached.append(cached_layer_states(target, data.tokens, data.lengths, picked, cfg.data_path,
                                              cfg.gen_batch_size, cfg.progress))  # fmt: skip
        head = DFlashHead(target.config, picked, head_layers, cfg.block_size, data.vocab)
        head.init_from(target)
        return head

    def loss(head: Any, target: Any, rows: torch.Tensor, b: Any) -> tuple[torch.Tensor, dict[str, float]]:
        taps = cached[0][b.rows].to(b.tokens.device) if cached else layer_states(target, b.tokens, picked)
        return objective.loss(lambda t, a: block_outputs(head, target.embed, t, taps, a), b, rows)

    return run_recipe(
        cfg, make_head, loss, pick=lambda head, target, val, sizes: pick_vocab(head, target, val, sizes, objective),
        title="DFlash head", loss_label=f"soft CE, slot decay exp(-j / {cfg.decay:g})", check_target=check_target,
        metadata=lambda head: head.file_fields(), gamma=cfg.decay, anchors=cfg.anchors,
    )  # fmt: skip
