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

from decodekit.train.recipe import HeadConfig, run_recipe, shares

__all__ = [
    "accepted_prefix",
    "block_loss",
    "block_mask",
    "block_outputs",
    "dflash_loss",
    "pick_vocab",
    "sample_anchors",
    "train",
]


def sample_anchors(
    lengths: torch.Tensor, starts: torch.Tensor, count: int, generator: torch.Generator | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Up to ``count`` distinct anchors per row, uniform over the response positions ``[starts, lengths - 2]`` (the
    anchor is a response token and at least one token follows it), in ascending order, as SpecForge's DFlash trainer
    draws them: ``anchors [B, count]`` and ``valid [B, count]`` (False past a row's candidates, whose anchors are
    0)."""
    lo = starts.clamp(min=0)
    span = (lengths - 1 - lo).clamp(min=0)  # candidates lo .. lengths - 2
    width = max(int(span.max()), count) if len(span) else count
    keys = torch.rand(len(lengths), width, generator=generator, device="cpu" if generator is not None else None)
    keys = keys.to(lengths.device).masked_fill(torch.arange(width, device=lengths.device) >= span[:, None], 2.0)
    offsets = keys.argsort(1)[:, :count].sort(1).values  # distinct: a random subset, ascending
    valid = offsets < span[:, None]
    return (lo[:, None] + offsets).where(valid, 0), valid


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


def _at(feats: torch.Tensor, at: torch.Tensor) -> torch.Tensor:
    """``feats [B, L, H]`` at the positions before ``at [B, A, m]`` (whose features predict the tokens at ``at``)
    -> ``[B, A * m, H]``."""
    index = (at - 1).clamp(max=feats.shape[1] - 1).flatten(1)[..., None].expand(-1, -1, feats.shape[2])
    return feats.gather(1, index)


def accepted_prefix(hit: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """The mean greedy accepted prefix of the valid blocks: ``hit [B, A, n - 1]`` (slot matches), ``valid [B, A]``."""
    return hit.long().cumprod(-1).sum(-1)[valid].float().mean() if bool(valid.any()) else torch.zeros(())


def dflash_loss(
    head: Any,
    embed: Any,
    w_d: torch.Tensor,
    tokens: torch.Tensor,
    taps: torch.Tensor,
    feats: torch.Tensor,
    anchors: torch.Tensor,
    valid: torch.Tensor,
    lengths: torch.Tensor,
    gamma: float,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The DFlash loss on a batch (module docstring): ``tokens [B, L]``, the tapped layer states ``taps [B, L, k H]``,
    the target's final features ``feats [B, L, H]``, ``anchors`` / ``valid [B, A]`` (:func:`sample_anchors`),
    ``lengths [B]``; ``w_d [V_d, H]`` the output rows the loss scores. Returns the loss and ``acc`` (slot 1's top-1
    agreement with the target over ``V_d``), ``accept`` (the mean greedy accepted prefix of a block: how many of its
    ``n - 1`` drafts in a row match the target's argmax over ``V_d``)."""
    out, at = block_outputs(head, embed, tokens, taps, anchors)
    return block_loss(out, at, valid, lengths, feats, w_d, gamma)


def block_loss(
    out: torch.Tensor,
    at: torch.Tensor,
    valid: torch.Tensor,
    lengths: torch.Tensor,
    feats: torch.Tensor,
    w_d: torch.Tensor,
    gamma: float,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The block drafters' loss (DFlash's, FlexDraft's) from a head's outputs ``out [B, A, m, H]`` at the slots
    predicting the tokens at ``at [B, A, m]``: each slot's soft cross-entropy to the target's distribution over the
    rows ``w_d [V_d, H]`` (from its final features ``feats [B, L, H]`` at ``at - 1``), slot ``j`` (1-based) weighted
    ``exp(-(j - 1) / gamma)``, slots past ``lengths [B]`` or of invalid blocks (``valid [B, A]``) left out. Returns
    the loss and ``acc`` (the first slot's top-1 agreement) and ``accept`` (the mean greedy accepted prefix)."""
    real = valid[..., None] & (at < lengths[:, None, None])
    logq = (out @ w_d.T).float().log_softmax(-1)
    with torch.no_grad():
        p = (_at(feats, at).float() @ w_d.T.float()).softmax(-1).unflatten(1, at.shape[1:])
    weight = torch.exp(-torch.arange(at.shape[2], device=at.device) / gamma)  # slot j: exp(-(j - 1) / gamma)
    ce = -(p * logq).sum(-1)  # [B, A, n - 1]
    loss = (ce * weight * real).sum() / (weight * real).sum().clamp(min=1e-9)
    hit = (logq.argmax(-1) == p.argmax(-1)) & real
    acc = float(hit[..., 0].sum() / real[..., 0].sum().clamp(min=1))
    return loss, {"acc": acc, "accept": float(accepted_prefix(hit, valid))}


@torch.no_grad()
def pick_vocab(head: Any, target: Any, val: Any, sizes: Sequence[int], anchors: int) -> dict[str, Any]:
    """The draft vocabulary size whose held-out blocks have the longest mean greedy accepted prefix against the
    target's argmax over its whole vocabulary (the head's cost hardly depends on the size: the slots' scores are a
    small product next to the target's forward), with each size's. One head forward per batch serves every size."""
    from decodekit.drafters.head_files import head_rows
    from decodekit.train.layer_features import layer_states

    dev, gen = target.device, torch.Generator().manual_seed(0)
    totals: dict[int, float] = {s: 0.0 for s in sizes}
    blocks = 0
    for i in range(0, len(val.lengths), 8):
        tokens, feats, lengths, starts = val.batch(torch.arange(i, min(i + 8, len(val.lengths))), dev)
        where, valid = sample_anchors(lengths, starts, anchors, gen)
        out, at = block_outputs(head, target.embed, tokens, layer_states(target, tokens, head.target_layers), where)
        real = valid[..., None] & (at < lengths[:, None, None])
        want = target.head(_at(feats, at).float()).argmax(-1).unflatten(1, at.shape[1:])  # [B, A, n - 1]
        vocab = head.vocab.to(dev)
        scores = out @ head_rows(target, vocab[: max(sizes)])[0].T  # the target's output rows, dense
        for s in sizes:
            hit = (vocab[scores[..., :s].argmax(-1)] == want) & real
            totals[s] += float(accepted_prefix(hit, valid)) * int(valid.sum())
        blocks += int(valid.sum())
    accept = {s: totals[s] / max(blocks, 1) for s in sizes}
    return {"picked": max(sizes, key=lambda s: (accept[s], -s)), "accept": accept}


@shares(HeadConfig)
def train(
    out_dir: str | Path,
    *,
    layers: tuple[int, ...] | None = None,
    head_layers: int = 1,
    block_size: int = 8,
    anchors: int = 16,
    gamma: float | None = None,
    **shared: Any,
) -> dict[str, Any]:
    """Train the head; returns the summary numbers (also in ``summary.json``). The recipe's own knobs: the target
    ``layers`` fused (1-based; None: DFlash's default for ``head_layers``), ``head_layers``, ``block_size`` (slots
    a block, the anchor's included), ``anchors`` per sequence a step, the decay ``gamma`` (None: ``block_size / 2``);
    ``shared``: :class:`~decodekit.train.recipe.HeadConfig`'s. ``decodekit/recipes/train/dflash.yaml`` documents
    each."""
    cfg = HeadConfig.of("dflash", locals(), train_vocab=16384, vocab_sizes=(4096, 16384), epochs=2, lr=5e-4)
    gamma = block_size / 2 if gamma is None else float(gamma)
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
        head = DFlashHead(target.hf.config, picked, head_layers, block_size, data.vocab)
        head.init_from(target)
        return head

    generator = torch.Generator().manual_seed(int(cfg.seed))

    def loss(head: Any, target: Any, rows: torch.Tensor, b: Any) -> tuple[torch.Tensor, dict[str, float]]:
        where, valid = sample_anchors(b.lengths, b.starts, anchors, generator)
        taps = cached[0][b.rows].to(b.tokens.device) if cached else layer_states(target, b.tokens, picked)
        return dflash_loss(head, target.embed, rows, b.tokens, taps, b.feats, where, valid, b.lengths, gamma)

    return run_recipe(
        cfg, make_head, loss, pick=lambda head, target, val, sizes: pick_vocab(head, target, val, sizes, anchors),
        title="DFlash head", loss_label=f"soft CE, slot decay exp(-j / {gamma:g})", check_target=check_target,
        metadata=lambda head: head.file_fields(), gamma=gamma, anchors=anchors,
    )  # fmt: skip
