"""Train a FlexDraft head for a target (``python -m decodekit train recipe=flexdraft``, docs/training.md): the
``flexdraft`` drafter (:mod:`decodekit.drafters.flexdraft`), the target drafting through mask slots.

Self-distillation on the feature heads' cached sequences (:mod:`decodekit.train.feature_data`), on the shared runner
(:func:`~decodekit.train.recipe.run_recipe`). Each step samples ``anchors`` positions ``a`` per sequence inside its
response (:func:`~decodekit.train.dflash.sample_anchors`). After the sequence itself, each anchor gets a block of
``block_size - 1`` mask slots at positions ``a + 1 ..``, which attend to the sequence up to ``a`` (the pending
token's place: its path is the target's) and to the block's own slots (:func:`flex_inputs`); the sequence attends
causally to itself. One no-grad early-exit forward of the target runs everything through its first ``L - n`` layers;
the head's last ``n`` layers then run with their tuned attention projections at the mask slots only
(:class:`~decodekit.drafters.flexdraft_head.FlexDraftHead`), the target's everywhere else. Mask slot ``j`` learns the
target's distribution of the token at ``a + j + 1`` (soft cross-entropy over the ``train_vocab`` most frequent
tokens, slot ``j`` weighted ``exp(-(j - 1) / gamma)``: :func:`~decodekit.train.dflash.block_loss`, DFlash's). The
target (embedding, output head, every other weight) stays frozen; only the tuned projections learn.

Reconstructed ``[paper]``: FlexDraft's training (arXiv 2605.20022; not reachable here) tunes the attention
projections of the last layers on mask tokens only; the anchors, the block layout, the soft target and the decay
are ours (DFlash's recipe's). A step runs the target's first layers on every sequence (no cache of its states: the
mask slots' depend on the anchors), so a run belongs on a GPU; the CPU runs the tests' smoke runs.

Writes to ``out_dir``: ``data/`` (unless ``data_dir``), ``checkpoints/``, ``history.json``, ``summary.json``,
``loss.png`` and ``flexdraft_<base>.safetensors`` (pass it as ``weights=`` to the ``flexdraft`` drafter).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from decodekit.train.dflash import _at, accepted_prefix, block_loss, sample_anchors
from decodekit.train.recipe import HeadConfig, run_recipe, shares

__all__ = ["flex_inputs", "flex_outputs", "flexdraft_loss", "train"]


def flex_inputs(
    tokens: torch.Tensor, anchors: torch.Tensor, block: int, mask_token_id: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The sequences ``tokens [B, T]`` followed by ``block - 1`` mask slots per anchor of ``anchors [B, A]``:
    ``inputs [B, N]``, ``positions [B, N]`` and ``mask [B, 1, N, N]`` (``N = T + A (block - 1)``; module
    docstring)."""
    (batch, length), count, m = tokens.shape, anchors.shape[1], block - 1
    dev = tokens.device
    slots = anchors[..., None] + 1 + torch.arange(m, device=dev)  # [B, A, m]
    inputs = torch.cat([tokens, tokens.new_full((batch, count * m), mask_token_id)], 1)
    positions = torch.cat([torch.arange(length, device=dev).expand(batch, -1), slots.flatten(1)], 1)
    keys = torch.arange(length, device=dev)
    causal = (keys[None, :] <= keys[:, None]).expand(batch, -1, -1)  # [B, T, T]
    sequence = torch.cat([causal, causal.new_zeros(batch, length, count * m)], -1)
    seen = (keys[None, None] <= anchors[..., None]).repeat_interleave(m, 1)  # [B, A m, T]
    own = torch.arange(count, device=dev).repeat_interleave(m)
    same = (own[:, None] == own[None, :]).expand(batch, -1, -1)  # [B, A m, A m]
    return inputs, positions, torch.cat([sequence, torch.cat([seen, same], -1)], 1)[:, None]


def flex_outputs(
    head: Any, target: Any, tokens: torch.Tensor, anchors: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The head's normed outputs ``[B, A, block - 1, H]`` at the mask slots of the blocks at ``anchors [B, A]``
    after ``tokens [B, T]``, and the position of the token each slot predicts ``[B, A, block - 1]``."""
    m, (batch, length), count = head.block_size - 1, tokens.shape, anchors.shape[1]
    inputs, positions, mask = flex_inputs(tokens, anchors, head.block_size, head.mask_token_id)
    with torch.no_grad():  # the target's first layers, frozen everywhere
        cache = target.new_cache(batch, inputs.shape[1])
        cache.stage(inputs.shape[1])
        none = torch.zeros(batch, 0, dtype=torch.long, device=tokens.device)
        x = target.forward(inputs, positions, mask, cache, none, exit_layer=head.first, hidden_layers=(head.first,))
    out = head(target, x.hidden[head.first], length, positions, mask)[:, length:]
    at = anchors[..., None] + 2 + torch.arange(m, device=tokens.device)
    return out.unflatten(1, (count, m)), at


def flexdraft_loss(
    head: Any,
    target: Any,
    w_d: torch.Tensor,
    tokens: torch.Tensor,
    feats: torch.Tensor,
    anchors: torch.Tensor,
    valid: torch.Tensor,
    lengths: torch.Tensor,
    gamma: float,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The FlexDraft loss on a batch (module docstring): ``tokens [B, L]``, the target's final features
    ``feats [B, L, H]``, ``anchors`` / ``valid [B, A]``, ``lengths [B]``, ``w_d [V_d, H]`` the output rows scored.
    Returns the loss, ``acc`` (the first mask slot's top-1 agreement over ``V_d``) and ``accept`` (the mean greedy
    accepted prefix of the mask slots)."""
    out, at = flex_outputs(head, target, tokens, anchors)
    return block_loss(out, at, valid, lengths, feats, w_d, gamma)


@torch.no_grad()
def held_out_accept(head: Any, target: Any, val: Any, anchors: int) -> float:
    """The held-out blocks' mean greedy accepted prefix of mask-slot drafts against the target's argmax over its
    whole vocabulary (the drafter scores the whole vocabulary: its first draft is the target's own)."""
    dev, gen = target.device, torch.Generator().manual_seed(0)
    total, blocks = 0.0, 0
    for i in range(0, len(val.lengths), 8):
        tokens, feats, lengths, starts = val.batch(torch.arange(i, min(i + 8, len(val.lengths))), dev)
        where, valid = sample_anchors(lengths, starts, anchors, gen)
        out, at = flex_outputs(head, target, tokens, where)
        real = valid[..., None] & (at < lengths[:, None, None])
        want = target.head(_at(feats, at).float()).argmax(-1).unflatten(1, at.shape[1:])
        hit = (target.head(out).argmax(-1) == want) & real
        total += float(accepted_prefix(hit, valid)) * int(valid.sum())
        blocks += int(valid.sum())
    return total / max(blocks, 1)


@shares(HeadConfig)
def train(
    out_dir: str | Path,
    *,
    tuned_layers: int = 2,
    block_size: int = 8,
    anchors: int = 16,
    gamma: float | None = None,
    mask_token_id: int | None = None,
    **shared: Any,
) -> dict[str, Any]:
    """Train the head; returns the summary numbers (also in ``summary.json``). The recipe's own knobs: the last
    ``tuned_layers`` layers' attention projections tuned, ``block_size`` (slots a block, the pending token's
    included), ``anchors`` per sequence a step, the decay ``gamma`` (None: ``block_size / 2``), ``mask_token_id``
    (None: the vocabulary's last id); ``shared``: :class:`~decodekit.train.recipe.HeadConfig`'s.
    ``decodekit/recipes/train/flexdraft.yaml`` documents each."""
    cfg = HeadConfig.of("flexdraft", locals(), train_vocab=16384, vocab_sizes=(16384,), epochs=1, lr=1e-4)
    gamma = block_size / 2 if gamma is None else float(gamma)
    from decodekit.drafters.flexdraft_head import FlexDraftHead, check_target

    def make_head(target: Any, data: Any) -> FlexDraftHead:
        target.hf.requires_grad_(False)  # frozen: only the tuned projections learn
        mask_id = target.vocab_size - 1 if mask_token_id is None else int(mask_token_id)
        head = FlexDraftHead(target, tuned_layers, block_size, mask_id)
        head.init_from(target)
        return head

    generator = torch.Generator().manual_seed(int(cfg.seed))

    def loss(head: Any, target: Any, rows: torch.Tensor, b: Any) -> tuple[torch.Tensor, dict[str, float]]:
        where, valid = sample_anchors(b.lengths, b.starts, anchors, generator)
        return flexdraft_loss(head, target, rows, b.tokens, b.feats, where, valid, b.lengths, gamma)

    def pick(head: Any, target: Any, val: Any, sizes: Any) -> dict[str, Any]:
        return {"picked": max(sizes), "accept": held_out_accept(head, target, val, anchors)}

    return run_recipe(
        cfg, make_head, loss, pick=pick, title="FlexDraft head", loss_label=f"soft CE, slot decay exp(-j / {gamma:g})",
        check_target=lambda target: check_target(target, tuned_layers), keep=lambda head, vocab: None,
        metadata=lambda head: head.file_fields(), gamma=gamma, anchors=anchors,
    )  # fmt: skip
