"""Train a FlexDraft head for a target (``python -m decodekit train recipe=flexdraft``, docs/training.md): the
``flexdraft`` drafter (:mod:`decodekit.drafters.flexdraft`), the target drafting through mask slots.

Self-distillation on the feature heads' cached sequences (:mod:`decodekit.train.feature_data`), on the shared runner
(:func:`~decodekit.train.recipe.run_recipe`). The sequences' states entering layer ``L - n`` are the target's, fixed:
on the CPU they are computed once and cached next to the data (as ``dflash`` caches its taps), on a GPU per batch.
Each step samples ``anchors`` positions ``a`` per sequence inside its response
(:func:`~decodekit.train.blocks.sample_anchors`). After the sequence itself, each anchor gets a block of
``block_size - 1`` mask slots (the head's mask embedding) at positions ``a + 1 ..``, which attend to the sequence up
to ``a`` (the pending token's place: its path is the target's) and to the block's own slots (:func:`flex_layout`);
the sequence attends causally to itself. The head's last ``n`` layers run over all of it with their tuned attention
projections at the mask slots only (:class:`~decodekit.drafters.flexdraft_head.FlexDraftHead`), the target's
everywhere else. Mask slot ``j`` learns the
target's distribution of the token at ``a + j + 1`` (soft cross-entropy over the ``train_vocab`` most frequent
tokens, slot ``j`` weighted ``exp(-(j - 1) / gamma)``: :func:`~decodekit.train.blocks.block_loss`, DFlash's). The
target (embedding, output head, every other weight) stays frozen; only the tuned projections and the mask embedding
(started from the data's mean state at layer ``L - n``) learn.

Reconstructed ``[paper]``: FlexDraft's training (arXiv 2605.20022; its method sections and training code were not
reachable here) tunes the attention projections of the last layers on mask tokens only; the anchors, the block
layout, the soft target, the decay and the mask embedding's start are ours (DFlash's recipe's). A step runs only
the last ``n`` layers, so the CPU trains a head in minutes.

Writes to ``out_dir``: ``data/`` (unless ``data_dir``), ``checkpoints/``, ``history.json``, ``summary.json``,
``loss.png`` and ``flexdraft_<base>.safetensors`` (pass it as ``weights=`` to the ``flexdraft`` drafter).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from decodekit.train.blocks import BlockConfig, BlockObjective, mean_accepted
from decodekit.train.recipe import run_recipe, shares

__all__ = ["entry_states", "flex_layout", "flex_outputs", "held_out_accept", "train"]


def flex_layout(length: int, anchors: torch.Tensor, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``positions [B, N]`` and ``mask [B, 1, N, N]`` for sequences of ``length`` tokens followed by ``block - 1``
    mask slots per anchor of ``anchors [B, A]`` (``N = length + A (block - 1)``; module docstring)."""
    (batch, count), m, dev = anchors.shape, block - 1, anchors.device
    slots = anchors[..., None] + 1 + torch.arange(m, device=dev)  # [B, A, m]
    positions = torch.cat([torch.arange(length, device=dev).expand(batch, -1), slots.flatten(1)], 1)
    keys = torch.arange(length, device=dev)
    causal = (keys[None, :] <= keys[:, None]).expand(batch, -1, -1)  # [B, T, T]
    sequence = torch.cat([causal, causal.new_zeros(batch, length, count * m)], -1)
    seen = (keys[None, None] <= anchors[..., None]).repeat_interleave(m, 1)  # [B, A m, T]
    own = torch.arange(count, device=dev).repeat_interleave(m)
    same = (own[:, None] == own[None, :]).expand(batch, -1, -1)  # [B, A m, A m]
    return positions, torch.cat([sequence, torch.cat([seen, same], -1)], 1)[:, None]


def entry_states(head: Any, target: Any, tokens: torch.Tensor) -> torch.Tensor:
    """``[B, T, H]``: the states of ``tokens [B, T]`` entering the head's first layer (the target's layer ``L - n``
    outputs)."""
    from decodekit.train.layer_features import layer_states  # no-grad

    return layer_states(target, tokens, (head.first,))


def flex_outputs(
    head: Any, target: Any, states: torch.Tensor, anchors: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The head's normed outputs ``[B, A, block - 1, H]`` at the mask slots of the blocks at ``anchors [B, A]``
    after sequences whose :func:`entry_states` are ``states [B, T, H]``, and the position of the token each slot
    predicts ``[B, A, block - 1]``."""
    m, (batch, length, _), count = head.block_size - 1, states.shape, anchors.shape[1]
    positions, mask = flex_layout(length, anchors, head.block_size)
    x = torch.cat([states, head.mask_slots(batch, count * m).to(states)], 1)
    out = head(target, x, length, positions, mask)[:, length:]
    at = anchors[..., None] + 2 + torch.arange(m, device=anchors.device)
    return out.unflatten(1, (count, m)), at


def held_out_accept(head: Any, target: Any, val: Any, objective: BlockObjective) -> float:
    """The held-out blocks' mean greedy accepted prefix of mask-slot drafts against the target's argmax over its
    whole vocabulary (the drafter scores the whole vocabulary: its first draft is the target's own)."""

    def outputs(tokens: torch.Tensor, anchors: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return flex_outputs(head, target, entry_states(head, target, tokens), anchors)

    blocks = objective.held_out(target, val, outputs)
    return mean_accepted(blocks, lambda batch: [target.head(batch.out).argmax(-1) == batch.want])[0]


def mean_response_state(head: Any, target: Any, data: Any, cached: torch.Tensor | None, rows: int = 64) -> torch.Tensor:
    """``[H]``: the mean entry state (:func:`entry_states`) over the response tokens of the first ``rows`` training
    sequences of ``data`` (from ``cached`` states, one per sequence of ``data``, where given): the mask embedding's
    start."""
    picked = (~data.held).nonzero()[:rows, 0]
    tokens, lengths, starts = data.tokens[picked], data.lengths[picked], data.starts[picked]
    states = cached[picked].float() if cached is not None else entry_states(head, target, tokens.to(target.device))
    where = torch.arange(tokens.shape[1])[None]
    response = ((where >= starts[:, None]) & (where < lengths[:, None])).to(states.device)
    return (states * response[..., None]).sum((0, 1)) / response.sum().clamp(min=1)


@shares(BlockConfig)
def train(out_dir: str | Path, *, tuned_layers: int = 2, **shared: Any) -> dict[str, Any]:
    """Train the head; returns the summary numbers (also in ``summary.json``). The recipe's own knob: the last
    ``tuned_layers`` layers' attention projections tuned; ``shared``: :class:`~decodekit.train.blocks.BlockConfig`'s
    (``block_size``: the pending token's slot included; ``anchors``, ``gamma``).
    ``decodekit/recipes/train/flexdraft.yaml`` documents each."""
    cfg = BlockConfig.of("flexdraft", locals(), train_vocab=16384, vocab_sizes=(16384,), epochs=1, lr=1e-4)
    objective = BlockObjective.of(cfg)
    from decodekit.drafters.flexdraft_head import FlexDraftHead, check_target
    from decodekit.train.feature_heads import device_settings
    from decodekit.train.layer_features import cached_layer_states

    _, online = device_settings(cfg.device, cfg.online, cfg.time_budget_s)
    cached: list[torch.Tensor] = []  # every sequence's entry states, when the features are cached (the CPU)

    def make_head(target: Any, data: Any) -> FlexDraftHead:
        target.hf.requires_grad_(False)  # frozen: only the tuned projections and the mask embedding learn
        head = FlexDraftHead(target, tuned_layers, cfg.block_size)
        if not online:  # once: a step then runs no target forward
            cached.append(cached_layer_states(target, data.tokens, data.lengths, (head.first,), cfg.data_path,
                                              cfg.gen_batch_size, cfg.progress))  # fmt: skip
        head.init_from(target, mean_response_state(head, target, data, cached[0] if cached else None))
        return head

    def entry_layer(target: Any) -> tuple[int, ...] | None:
        check_target(target, tuned_layers)
        return None if online else (target.num_layers - int(tuned_layers),)  # cached by the features' forward

    def loss(head: Any, target: Any, rows: torch.Tensor, b: Any) -> tuple[torch.Tensor, dict[str, float]]:
        states = cached[0][b.rows].to(b.feats) if cached else entry_states(head, target, b.tokens)
        return objective.loss(lambda tokens, a: flex_outputs(head, target, states, a), b, rows)

    def pick(head: Any, target: Any, val: Any, sizes: Any) -> dict[str, Any]:
        return {"picked": max(sizes), "accept": held_out_accept(head, target, val, objective)}

    return run_recipe(
        cfg, make_head, loss, pick=pick, title="FlexDraft head", check_target=entry_layer,
        loss_label=f"soft CE, slot decay exp(-j / {cfg.decay:g})", keep=lambda head, vocab: None,
        metadata=lambda head: head.file_fields(), gamma=cfg.decay, anchors=cfg.anchors,
    )  # fmt: skip
