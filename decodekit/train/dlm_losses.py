"""The masked-diffusion losses of the DLM adapter recipe (:mod:`decodekit.train.dlm_adapter`), shifted logits
throughout (slot ``j`` is predicted by the output at ``j - 1``: AR initialisation, as Dream and Fast-dLLM v2 do).

* :func:`masked_diffusion_loss`: LLaDA's pre-training ELBO on plain chunks, bidirectional attention.
* :func:`region_diffusion_loss`: the same ELBO on a *region* of each row (a response after its prompt, or the last
  ``G`` tokens of a text chunk) with the rest as clean context, the way the sampler sees it (LLaDA's SFT masks only
  the response). Bidirectional, or **block-causal** (block diffusion: BD3-LM, SDAR, Fast-dLLM v2): the region cut
  into blocks of ``block_length`` counted from its start, each block denoised from a clean copy of everything
  before it, all blocks in one forward (BD3-LM's vectorised training: the clean row and the noisy region side by
  side in one sequence, under a mask that gives each noisy block its own and the clean earlier blocks).
* :func:`draft_alignment_loss`: the ``diffusion`` drafter's condition (a clean context, then ``k`` slots all masked,
  denoised in one forward): DEER's diffusion-to-autoregressive alignment, reconstructed.
"""

from __future__ import annotations

from typing import NamedTuple

import torch


class Regions(NamedTuple):
    """Rows with a region each: ``tokens [B, N]`` (row ``b`` real in ``[0, lengths[b])``; the padding is never
    attended to), the region of row ``b`` being ``[starts[b], lengths[b])`` (``lengths``, ``starts``: ``[B]``)."""

    tokens: torch.Tensor
    lengths: torch.Tensor
    starts: torch.Tensor

    def to(self, device: torch.device | str) -> Regions:
        return Regions(*(x.to(device) for x in self))


def masked_diffusion_loss(
    model: torch.nn.Module, tokens: torch.Tensor, mask_token_id: int, generator: torch.Generator, eps: float = 1e-3
) -> torch.Tensor:
    """The shifted masked-diffusion ELBO of ``tokens [B, L]``: a scalar.

    Per row ``t ~ U(0, 1)``, ``p = (1 - eps) t + eps``; each token but the first (no position predicts it) masked with
    probability ``p``; cross-entropy on the masked tokens weighted by ``1 / p``, summed and divided by ``B * L``.
    Attention is bidirectional (an all-True 4-D mask)."""
    batch, length = tokens.shape
    t = torch.rand(batch, 1, generator=generator, device=tokens.device)
    p = (1 - eps) * t + eps
    masked = torch.rand(batch, length, generator=generator, device=tokens.device) < p
    masked[:, 0] = False
    inputs = tokens.masked_fill(masked, mask_token_id)
    full = torch.ones(batch, 1, length, length, dtype=torch.bool, device=tokens.device)
    logits = model(input_ids=inputs, attention_mask=full).logits[:, :-1].float()
    ce = torch.nn.functional.cross_entropy(logits.transpose(1, 2), tokens[:, 1:], reduction="none")
    return (ce * masked[:, 1:] / p).sum() / (batch * length)


def region_diffusion_loss(
    model: torch.nn.Module,
    regions: Regions,
    mask_token_id: int,
    generator: torch.Generator,
    block_length: int | None = None,
    eps: float = 1e-3,
) -> torch.Tensor:
    """The shifted masked-diffusion ELBO of each row's region ``[starts[b], lengths[b])``: a scalar.

    Per block of the region (the whole region when bidirectional) ``t ~ U(0, 1)``, ``p = (1 - eps) t + eps``; each
    region slot masked with probability ``p``; ``sum over masked slots of CE / p`` divided by the number of region
    slots. The arguments are :func:`region_logits`'s (no ``masked``), plus the noise ``generator`` and ``eps``."""
    tokens, lengths, starts = regions
    span = int((lengths - starts).max())
    slot = torch.arange(span, device=tokens.device)
    real = starts[:, None] + slot < lengths[:, None]
    block = slot // (block_length or span)
    t = torch.rand(len(tokens), int(block[-1]) + 1, generator=generator, device=tokens.device)
    p = ((1 - eps) * t + eps)[:, block]  # [B, R]
    masked = (torch.rand(len(tokens), span, generator=generator, device=tokens.device) < p) & real
    logits, target = region_logits(model, regions, masked, mask_token_id, block_length)
    ce = torch.nn.functional.cross_entropy(logits.transpose(1, 2), target, reduction="none")
    return (ce * masked / p).sum() / real.sum().clamp(min=1)


def draft_alignment_loss(
    model: torch.nn.Module,
    regions: Regions,
    mask_token_id: int,
    generator: torch.Generator,
    draft_length: int,
    decay: float = 1.0,
    block_length: int | None = None,
) -> torch.Tensor:
    """DEER's alignment of a diffusion drafter to its autoregressive target (Cheng et al. 2025), reconstructed from
    the paper's description: each row cut at a point ``c`` uniform in its region ``[starts[b], lengths[b])`` (the
    target's own response: self-distilled continuation data), everything before ``c`` a clean context, the next
    ``draft_length`` tokens all masked (the drafter's single-step condition) and predicted in one forward; the
    cross-entropy of slot ``j`` weighted by ``decay ** j`` (``decay = 1``: DEER's first stage, continuation
    distillation; ``< 1``: its second, accuracy near the verification boundary weighted up), divided by the weights'
    sum. Not the authors' code (unpublished here): their exact noise on the suffix, ``[SEP]`` marker and weights are
    not reproduced. ``block_length``: block-causal attention with blocks from the cut, as the drafter runs it."""
    tokens, lengths, starts = regions
    batch = len(tokens)
    span = (lengths - starts).clamp(min=1)
    cut = starts + (torch.rand(batch, generator=generator, device=tokens.device) * span).long().clamp(max=span - 1)
    end = torch.minimum(cut + draft_length, lengths)
    width = int((end - cut).max())
    slot = torch.arange(width, device=tokens.device)
    masked = slot[None] < (end - cut)[:, None]
    logits, target = region_logits(model, Regions(tokens, end, cut), masked, mask_token_id, block_length)
    ce = torch.nn.functional.cross_entropy(logits.transpose(1, 2), target, reduction="none")
    weight = masked * decay ** slot.float()[None]
    return (ce * weight).sum() / weight.sum()


def region_logits(
    model: torch.nn.Module, regions: Regions, masked: torch.Tensor, mask_token_id: int, block_length: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The logits of every region slot with the slots ``masked`` replaced by the mask token, in one forward.

    Args:
        model: a transformers causal LM (or its peft wrapper) whose ``.model`` gives hidden states and ``lm_head`` the
            logits; it takes explicit ``position_ids`` and a 4-D boolean attention mask.
        regions: the rows and their regions; ``1 <= starts[b] < lengths[b]`` (the region's first slot is predicted
            from the context's last position).
        masked: ``[B, R]`` bool, ``R = max(lengths - starts)``: the region slots to mask (only real ones).
        block_length: None = bidirectional attention over the whole row; else block-causal: block ``k`` of the region
            (slots ``[k B, (k + 1) B)``) sees the clean context, the clean region blocks before it and itself (with
            its masks); its first slot is predicted from the clean position before it. These are the logits the
            block-causal sampler computes for that block (``Recompute(block_causal=True)``,
            :class:`~decodekit.dlm.caches.BlockCausalCache`).

    Returns:
        ``logits [B, R, V]`` float32 (slot ``j`` read at the output before it) and the clean ``target [B, R]``.
    """
    tokens, lengths, starts = regions
    batch, width = tokens.shape
    dev = tokens.device
    span = masked.shape[1]
    slot = torch.arange(span, device=dev)
    where = starts[:, None] + slot  # [B, R] canvas position of each region slot
    target = tokens.gather(1, where.clamp(max=width - 1))
    position = torch.arange(width, device=dev).expand(batch, width)
    valid = position < lengths[:, None]
    if block_length is None:  # noise the region in place; every real position sees every other
        ids = tokens.clone()
        row, col = masked.nonzero(as_tuple=True)
        ids[row, where[row, col]] = mask_token_id
        allowed = valid[:, None, :].expand(batch, width, width)
        source = where - 1
    else:  # BD3-LM's vectorised layout: the clean row, then the noisy region
        ids = torch.cat([tokens, target.masked_fill(masked, mask_token_id)], 1)
        position = torch.cat([position, where], 1)
        clean_block = torch.div(position[:, :width] - starts[:, None], block_length, rounding_mode="floor")
        blocks = torch.cat([clean_block, (slot // block_length).expand(batch, span)], 1)
        noisy = torch.zeros_like(blocks, dtype=torch.bool)
        noisy[:, width:] = True
        valid = torch.cat([valid, where < lengths[:, None]], 1)
        qb, kb, qn, kn = blocks[:, :, None], blocks[:, None, :], noisy[:, :, None], noisy[:, None, :]
        allowed = torch.where(qn, torch.where(kn, kb == qb, kb < qb), ~kn & (kb <= qb)) & valid[:, None, :]
        source = torch.where((slot % block_length == 0)[None], where - 1, width + slot - 1)
    total = ids.shape[1]
    allowed = allowed | torch.eye(total, dtype=torch.bool, device=dev)  # padded queries see themselves
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    hidden = inner.model(input_ids=ids, position_ids=position, attention_mask=allowed[:, None]).last_hidden_state
    picked = hidden.gather(1, source.clamp(min=0, max=total - 1)[..., None].expand(-1, -1, hidden.shape[-1]))
    return inner.lm_head(picked).float(), target
