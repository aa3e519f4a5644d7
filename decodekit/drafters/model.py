"""A separate (small) language model sharing the target's tokenizer drafts a chain autoregressively."""

from __future__ import annotations

from typing import Any

import torch

from decodekit.models import LanguageModel, load_model
from decodekit.registry import register
from decodekit.sampling import probs_from_logits, sample
from decodekit.state import DecodeState
from decodekit.types import Draft, DraftBudget, DraftKind, DraftStep, SamplingParams, Verdict


@register("drafter", "model")
class ModelDrafter:
    """Draft with a separate causal LM (speculative sampling's classic drafter).

    The drafter keeps its own :class:`~decodekit.cache.KVCache`. Each round it first feeds the tokens it has not
    seen (the pending token, plus the last accepted draft token when a whole chain was accepted), then samples
    one token per step. ``q`` of a sampled draft is exactly the distribution it was drawn from, so lossless
    verification needs no assumption; at temperature 0 it drafts the argmax (a deterministic draft).

    Args:
        model: the draft model (a :class:`LanguageModel`, a transformers causal LM or a path).
        temperature: sampling temperature of the drafter; None = the call's sampling parameters (temperature,
            top-k, top-p), which maximises acceptance. 0 = argmax drafts.
    """

    def __init__(self, model: Any, temperature: float | None = None) -> None:
        self.model: LanguageModel = load_model(model)
        self.temperature = temperature
        self.cache = None

    @property
    def vocab_size(self) -> int:
        return self.model.vocab_size

    def sampling(self, target: SamplingParams) -> SamplingParams:
        """The sampling parameters the drafter uses when the target uses ``target``."""
        if self.temperature is None:
            return target
        return SamplingParams(self.temperature, target.top_k, target.top_p)

    def draft_kind(self, sampling: SamplingParams) -> DraftKind:
        return DraftKind.DETERMINISTIC if self.sampling(sampling).greedy else DraftKind.SAMPLED

    def begin(self, state: DecodeState) -> None:
        """Prefill the draft model with each row's prompt (everything but the pending token)."""
        self.cache = self.model.new_cache(state.batch_size, state.tokens.shape[1])
        self.model.extend(self.cache, state.tokens[:, : int(state.lengths.max()) - 1], state.lengths - 1)

    def propose(self, state: DecodeState, budget: DraftBudget) -> Draft:
        sampling = self.sampling(state.sampling)
        k = budget.max_len
        unseen = state.lengths - self.cache.lengths  # >= 1: the pending token at least
        idx = self.cache.lengths[:, None] + torch.arange(int(unseen.max()), device=state.device)
        logits = self.model.extend(self.cache, state.tokens.gather(1, idx.clamp(max=state.tokens.shape[1] - 1)), unseen)
        if k == 0:
            return Draft.empty(state.batch_size, state.device)
        alive = budget.lengths > 0
        tokens, valid, qs = [], [], []
        for j in range(k):
            if sampling.greedy:
                x, probs = logits.argmax(-1), None
            else:
                probs = probs_from_logits(logits, sampling)
                x = sample(probs, state.generator)
            tokens.append(x)
            valid.append(alive)
            qs.append(probs)
            alive = alive & (j + 1 < budget.lengths)
            if budget.stop is not None:
                conf = probs if probs is not None else logits.float().softmax(-1)
                alive = alive & ~budget.stop(DraftStep(j, x, conf.gather(1, x[:, None])[:, 0], conf))
            if j + 1 == k or not bool(alive.any()):
                break
            logits = self.model.extend(self.cache, x[:, None], torch.ones_like(x))
        q = None if sampling.greedy else torch.stack(qs, 1)
        return Draft.chain(torch.stack(tokens, 1), valid=torch.stack(valid, 1), q=q)

    def observe(self, state: DecodeState, draft: Draft, verdict: Verdict) -> None:
        """Drop drafted tokens the target rejected: keep what agrees with the committed history."""
        self.cache.crop(state.lengths - 1)

    def select_rows(self, rows: torch.Tensor) -> None:
        self.cache.select_rows(rows)
