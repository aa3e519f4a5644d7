"""A diffusion LM drafts a block of slots for an autoregressive target (DEER's and SpecDiff-2's drafting).

DEER (Cheng et al. 2025, "DEER: Draft with Diffusion, Verify with Autoregressive Models") and SpecDiff-2 (Sandler et
al. 2025) draft with a masked diffusion LM that shares the target's vocabulary: after the committed context (the
pending token last) the drafter appends ``k`` mask slots and denoises them, in one forward by default (DEER's
single-step drafting), and the autoregressive target verifies the block. This module is that drafting step on any
:class:`~decodekit.dlm.DLMModel` (bidirectional, or block-causal with blocks counted from the generation start such
as the zoo's ``smollm2-135m-bdlm``); the papers' alignment training (DEER's two-stage distillation, SpecDiff-2's
train-test calibration) is not here, so the zoo DLMs draft as trained for diffusion sampling.

Lossless at any temperature. Slot ``j``'s token is drawn from the DLM's distribution at slot ``j`` after the call's
logits processors (given the slots before it), and that distribution is the draft's ``q``; with one denoising step
every slot's distribution comes from the same forward, so the law of token ``j`` given the tokens before it is
exactly ``q_j``, which rejection and SpecInfer verification need. With ``steps > 1`` the slots are committed left to
right in ``steps`` chunks, each chunk's forward seeing the chunks before it: still exactly ``q_j`` given the tokens
before ``j``. Committing by confidence instead (a diffusion sampler's usual order) would let a later slot's value
decide an earlier one's, whose reported ``q`` would then not be its law given the tokens before it: the verifier's
output would drift from the target's (``tests/unit/test_diffusion_drafter.py`` shows the drift with that order).

Cost: no cache across rounds here; every forward runs the DLM over the whole context plus the ``k`` slots (on a
CPU about what a prefill of the context costs the target), so it pays only where a round's verified run is long.
"""

from __future__ import annotations

from typing import Any

import torch

from decodekit.budget import DraftBudget
from decodekit.checks import check_float, check_int, check_model_spec
from decodekit.draft import Draft
from decodekit.drafters.chain import SamplesLikeTheTarget, draft_chain
from decodekit.errors import ConfigError
from decodekit.registry import register
from decodekit.state import DecodeState

__all__ = ["DiffusionDrafter"]


@register("drafter", "diffusion")
class DiffusionDrafter(SamplesLikeTheTarget):
    """Draft ``k`` tokens a round by denoising ``k`` mask slots with a diffusion LM (module docstring).

    Args:
        model: a :class:`~decodekit.dlm.DLMModel`, or anything :func:`decodekit.dlm.load_model` takes (a zoo DLM
            such as ``"smollm2-135m-bdlm"``, a released checkpoint directory); its vocabulary must be the target's.
        steps: denoising forwards per round (1: DEER's single step); the ``k`` slots are committed left to right in
            ``steps`` chunks (the first chunks one slot larger when ``k`` does not divide).
        temperature: the drafter's sampling temperature; None = the call's sampling parameters. 0 = argmax drafts.

    Raises:
        ConfigError: a block-causal DLM whose blocks lie on the absolute position grid (SDAR, Fast-dLLM v2,
            LLaDA 2: a draft block would straddle its blocks), a bad ``steps`` or ``temperature``.
    """

    def __init__(self, model: Any, steps: int = 1, temperature: float | None = None) -> None:
        from decodekit.dlm.model import DLMModel, load_model

        self.steps = check_int("steps", steps, low=1)
        self.temperature = check_float("temperature", temperature, low=0, optional=True, hint=" (None = the call's)")
        if not isinstance(model, DLMModel):
            check_model_spec("model", model)
            if not isinstance(model, str):  # a causal LM: it needs a mask token to become a DLM
                raise ConfigError(
                    f"DiffusionDrafter: model must be a diffusion LM; got {type(model).__name__}. Wrap a causal LM "
                    "first: dk.dlm.load_model(model, mask_token_id=..., shift_logits=...)"
                )
        self.model: DLMModel = model if isinstance(model, DLMModel) else load_model(model)
        if self.model.block_length is not None and self.model.block_grid != "generation":
            raise ConfigError(
                f"DiffusionDrafter: {self.model!r} is block-causal on the absolute position grid, where a draft block "
                "would straddle its blocks; not implemented (use a bidirectional DLM or one with blocks counted from "
                "the generation start, such as the zoo's smollm2-135m-bdlm)"
            )

    @property
    def vocab_size(self) -> int:
        return self.model.vocab_size

    def begin(self, state: DecodeState) -> None:
        if self.model.device != state.device:
            raise ConfigError(
                f"DiffusionDrafter: the diffusion LM is on {self.model.device}, the target on {state.device}; load "
                "both on one device"
            )

    def propose(self, state: DecodeState, budget: DraftBudget) -> Draft:
        k = budget.max_len
        if k == 0:
            return Draft.empty(state.batch_size, state.device)
        canvas, lengths = self._canvas(state, k)
        chunks = [k // self.steps + (i < k % self.steps) for i in range(min(self.steps, k))]
        starts = {sum(chunks[:i]) for i in range(1, len(chunks))}  # slots whose chunk needs a new forward
        logits = self._slot_logits(canvas, lengths, k)
        done = 0

        def advance(x: torch.Tensor) -> tuple[torch.Tensor, None]:
            nonlocal done, logits
            canvas.scatter_(1, (lengths + done)[:, None], x[:, None])  # the slot is a committed token now
            done += 1
            if done in starts:
                logits = self._slot_logits(canvas, lengths, k)
            return logits[:, done], None

        return draft_chain(state, budget, self.sampling(state.sampling), logits[:, 0], None, advance)

    def _canvas(self, state: DecodeState, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``[B, max(L) + k]``: each row's committed tokens (the pending one last), then ``k`` mask slots, then
        padding; and the rows' lengths ``L [B]``."""
        lengths = state.lengths
        width = max(state.host_lengths) + k
        canvas = torch.zeros(state.batch_size, width, dtype=torch.long, device=state.device)
        have = min(width, state.tokens.shape[1])
        canvas[:, :have] = state.tokens[:, :have]
        slots = lengths[:, None] + torch.arange(k, device=state.device)
        return canvas.scatter_(1, slots, self.model.mask_token_id), lengths

    def _slot_logits(self, canvas: torch.Tensor, lengths: torch.Tensor, k: int) -> torch.Tensor:
        """``[B, k, V]`` float32: the DLM's logits at the ``k`` slots (the mask token never drafted)."""
        logits, _ = self.model.forward(canvas, lengths + k, lengths, k, block_causal=self.model.block_length)
        logits[..., self.model.mask_token_id] = float("-inf")
        return logits
