"""What the block drafters' recipes share (``dflash``, ``flexdraft``): their knobs (:class:`BlockConfig`), the
anchors a step samples per sequence (:func:`sample_anchors`), the objective on a head's block outputs
(:class:`BlockObjective`: DFlash's soft cross-entropy with its slot decay) and the held-out blocks their vocabulary
picks score (:meth:`BlockObjective.held_out`).

A recipe keeps only its head and how the head turns a batch's blocks into outputs at the slots: ``outputs(tokens,
anchors) -> (out [B, A, m, H], at [B, A, m])``, ``at`` the position of the token each slot predicts.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import torch

from decodekit.train.recipe import Batch, HeadConfig

__all__ = [
    "BlockConfig",
    "BlockObjective",
    "Blocks",
    "HeldOutBlocks",
    "accepted_prefix",
    "block_loss",
    "mean_accepted",
    "sample_anchors",
]

Outputs = Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


@dataclasses.dataclass
class BlockConfig(HeadConfig):
    """:class:`~decodekit.train.recipe.HeadConfig`'s knobs and the block drafters': ``block_size`` (slots a block,
    the pending token's included), ``anchors`` (blocks per sequence a step) and the slot decay ``gamma`` (slot
    ``j``'s loss weight ``exp(-(j - 1) / gamma)``; None: ``block_size / 2``)."""

    block_size: int = 8
    anchors: int = 16
    gamma: float | None = None

    @property
    def decay(self) -> float:
        """``gamma``, its default filled in."""
        return self.block_size / 2 if self.gamma is None else float(self.gamma)


class Blocks(NamedTuple):
    """The blocks of a batch: ``anchors [B, A]`` (each block's first position, its pending token's) and ``valid
    [B, A]`` (False past a row's candidates, whose anchors are 0)."""

    anchors: torch.Tensor
    valid: torch.Tensor


class HeldOutBlocks(NamedTuple):
    """One held-out batch's blocks: the head's outputs ``out [B, A, m, H]`` at the slots, the target's argmax
    ``want [B, A, m]`` over its whole vocabulary for each slot's token, which slots are real (``real [B, A, m]``:
    in a valid block, before the row's end) and the blocks' ``valid [B, A]``."""

    out: torch.Tensor
    want: torch.Tensor
    real: torch.Tensor
    valid: torch.Tensor


def sample_anchors(
    lengths: torch.Tensor, starts: torch.Tensor, count: int, generator: torch.Generator | None = None
) -> Blocks:
    """Up to ``count`` distinct anchors per row, uniform over the response positions ``[starts, lengths - 2]`` (the
    anchor is a response token and at least one token follows it), in ascending order, as SpecForge's DFlash trainer
    draws them (:class:`Blocks`)."""
    lo = starts.clamp(min=0)
    span = (lengths - 1 - lo).clamp(min=0)  # candidates lo .. lengths - 2
    width = max(int(span.max()), count) if len(span) else count
    keys = torch.rand(len(lengths), width, generator=generator, device="cpu" if generator is not None else None)
    keys = keys.to(lengths.device).masked_fill(torch.arange(width, device=lengths.device) >= span[:, None], 2.0)
    offsets = keys.argsort(1)[:, :count].sort(1).values  # distinct: a random subset, ascending
    valid = offsets < span[:, None]
    return Blocks((lo[:, None] + offsets).where(valid, 0), valid)


def feats_before(feats: torch.Tensor, at: torch.Tensor) -> torch.Tensor:
    """``feats [B, L, H]`` at the positions before ``at [B, A, m]`` (whose features predict the tokens at ``at``)
    -> ``[B, A * m, H]``."""
    index = (at - 1).clamp(max=feats.shape[1] - 1).flatten(1)[..., None].expand(-1, -1, feats.shape[2])
    return feats.gather(1, index)


def accepted_prefix(hit: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """The mean greedy accepted prefix of the valid blocks: ``hit [B, A, m]`` (slot matches), ``valid [B, A]``."""
    return hit.long().cumprod(-1).sum(-1)[valid].float().mean() if bool(valid.any()) else torch.zeros(())


def block_loss(
    out: torch.Tensor, at: torch.Tensor, blocks: Blocks, batch: Batch, w_d: torch.Tensor, gamma: float
) -> tuple[torch.Tensor, dict[str, float]]:
    """The block drafters' loss (DFlash's, FlexDraft's) from a head's outputs ``out [B, A, m, H]`` at the slots
    predicting the tokens at ``at [B, A, m]``: each slot's soft cross-entropy to the target's distribution over the
    rows ``w_d [V_d, H]`` (from the batch's final features at ``at - 1``), slot ``j`` (1-based) weighted
    ``exp(-(j - 1) / gamma)``, slots past the row's length or of invalid blocks left out. Returns the loss and
    ``acc`` (the first slot's top-1 agreement) and ``accept`` (the mean greedy accepted prefix)."""
    real = blocks.valid[..., None] & (at < batch.lengths[:, None, None])
    logq = (out @ w_d.T).float().log_softmax(-1)
    with torch.no_grad():
        p = (feats_before(batch.feats, at).float() @ w_d.T.float()).softmax(-1).unflatten(1, at.shape[1:])
    weight = torch.exp(-torch.arange(at.shape[2], device=at.device) / gamma)  # slot j: exp(-(j - 1) / gamma)
    ce = -(p * logq).sum(-1)  # [B, A, m]
    loss = (ce * weight * real).sum() / (weight * real).sum().clamp(min=1e-9)
    hit = (logq.argmax(-1) == p.argmax(-1)) & real
    acc = float(hit[..., 0].sum() / real[..., 0].sum().clamp(min=1))
    return loss, {"acc": acc, "accept": float(accepted_prefix(hit, blocks.valid))}


class BlockObjective:
    """A block recipe's objective: ``anchors`` blocks per sequence a step, drawn from one seeded generator, scored
    by :func:`block_loss` with decay ``gamma``.

    Args:
        anchors: blocks per sequence.
        gamma: the slot decay.
        seed: the anchors' generator seed (the run's).
    """

    def __init__(self, anchors: int, gamma: float, seed: int = 0) -> None:
        self.anchors, self.gamma = anchors, gamma
        self.generator = torch.Generator().manual_seed(int(seed))

    @classmethod
    def of(cls, cfg: BlockConfig) -> BlockObjective:
        return cls(cfg.anchors, cfg.decay, cfg.seed)

    def sample(self, batch: Batch) -> Blocks:
        """This step's blocks for ``batch``."""
        return sample_anchors(batch.lengths, batch.starts, self.anchors, self.generator)

    def loss(
        self, outputs: Outputs, batch: Batch, w_d: torch.Tensor, blocks: Blocks | None = None
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """:func:`block_loss` of the head's ``outputs`` at ``blocks`` (None: this step's sample) of ``batch``."""
        blocks = self.sample(batch) if blocks is None else blocks
        out, at = outputs(batch.tokens, blocks.anchors)
        return block_loss(out, at, blocks, batch, w_d, self.gamma)

    @torch.no_grad()
    def held_out(self, target: Any, val: Any, outputs: Outputs, batch_size: int = 8) -> Iterator[HeldOutBlocks]:
        """The held-out data's blocks, batch by batch, with the head's ``outputs`` and the target's argmax (anchors
        from a generator seeded 0: every vocabulary size and run scores the same blocks)."""
        dev, gen = target.device, torch.Generator().manual_seed(0)
        for i in range(0, len(val.lengths), batch_size):
            tokens, feats, lengths, starts = val.batch(torch.arange(i, min(i + batch_size, len(val.lengths))), dev)
            blocks = sample_anchors(lengths, starts, self.anchors, gen)
            out, at = outputs(tokens, blocks.anchors)
            real = blocks.valid[..., None] & (at < lengths[:, None, None])
            want = target.head(feats_before(feats, at).float()).argmax(-1).unflatten(1, at.shape[1:])
            yield HeldOutBlocks(out, want, real, blocks.valid)


def mean_accepted(
    batches: Iterator[HeldOutBlocks], hits: Callable[[HeldOutBlocks], list[torch.Tensor]], count: int = 1
) -> list[float]:
    """The mean greedy accepted prefix over every held-out block for each of the ``count`` slot-match tensors
    ``hits(batch)`` returns (``[B, A, m]`` each: one per draft vocabulary scored), weighted by the blocks a batch
    holds."""
    totals, blocks = [0.0] * count, 0
    for batch in batches:
        weight = int(batch.valid.sum())
        for i, hit in enumerate(hits(batch)):
            totals[i] += float(accepted_prefix(hit & batch.real, batch.valid)) * weight
        blocks += weight
    return [t / max(blocks, 1) for t in totals]
