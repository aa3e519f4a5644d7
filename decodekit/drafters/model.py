"""A separate (small) language model sharing the target's tokenizer drafts a chain autoregressively."""

from __future__ import annotations

from typing import Any

import torch

from decodekit.budget import DraftBudget, DraftStep
from decodekit.checks import check_float, check_model_spec
from decodekit.draft import Draft, DraftKind
from decodekit.models import LanguageModel, load_model
from decodekit.processors import process_next
from decodekit.registry import register
from decodekit.round import Round
from decodekit.sampling import probs_from_logits, sample
from decodekit.state import DecodeState
from decodekit.types import SamplingParams


@register("drafter", "model")
class ModelDrafter:
    """Draft with a separate causal LM (speculative sampling's classic drafter).

    The drafter keeps its own :class:`~decodekit.cache.KVCache`. Each round it first feeds the tokens it has not
    seen (the pending token, plus the last accepted draft token when a whole chain was accepted), then samples
    one token per step, from its logits after the call's logits processors (the target's processing,
    :func:`~decodekit.processors.process_next`). ``q`` of a sampled draft is exactly the distribution it was
    drawn from, so lossless verification needs no assumption; at temperature 0 it drafts the argmax (a
    deterministic draft) and, when a component needs ``"kl"``, reports its softmax in ``Draft.draft_probs``.

    Host syncs: none of its own per round, except one per draft step when the budget has a stop rule (to stop
    early once every row stopped).

    A stop rule with ``needs_hidden = True`` (SpecDec++'s acceptance head, ``ThresholdHeadStop``) gets the draft
    model's final hidden state in :attr:`DraftStep.hidden`: at each step's input token (the pending token at step
    0, then the previous draft token). Only then are hidden states asked of the model.

    Args:
        model: the draft model (a :class:`LanguageModel`, a transformers causal LM or a path).
        temperature: sampling temperature of the drafter; None = the call's sampling parameters (temperature,
            top-k, top-p), which maximises acceptance. 0 = argmax drafts.
    """

    def __init__(self, model: Any, temperature: float | None = None) -> None:
        check_model_spec("model", model)
        self.temperature = check_float("temperature", temperature, low=0, optional=True, hint=" (None = the call's)")
        self.model: LanguageModel = load_model(model)
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
        seen = [n - 1 for n in state.host_lengths]
        self.model.extend(self.cache, state.tokens[:, : max(seen)], state.lengths - 1, host_counts=seen)

    def propose(self, state: DecodeState, budget: DraftBudget) -> Draft:
        sampling = self.sampling(state.sampling)
        k = budget.max_len
        needs_hidden = budget.stop is not None and bool(getattr(budget.stop, "needs_hidden", False))
        logits, hidden = self.feed_unseen_hidden(state, needs_hidden)
        if k == 0:
            return Draft.empty(state.batch_size, state.device)
        report = sampling.greedy and "kl" in state.needs
        alive = budget.lengths > 0
        tokens, valid, qs = [], [], []
        for j in range(k):
            logits = process_next(state, logits, torch.stack(tokens, 1) if tokens else None)
            if sampling.greedy:
                x, probs = logits.argmax(-1), (logits.float().softmax(-1) if report else None)
            else:
                probs = probs_from_logits(logits, sampling)
                x = sample(probs, state.generator, key=("draft", j))  # keyed by step: per-row seeds
            tokens.append(x)
            valid.append(alive)
            qs.append(probs)
            alive = alive & (j + 1 < budget.lengths)
            if budget.stop is not None:
                conf = probs if probs is not None else logits.float().softmax(-1)
                step = DraftStep(j, x, conf.gather(1, x[:, None])[:, 0], conf, hidden)
                alive = alive & ~budget.stop(step)
                if not bool(alive.any()):
                    break
            if j + 1 < k:
                out = self.model.extend(
                    self.cache, x[:, None], torch.ones_like(x), host_counts=1, return_hidden=needs_hidden
                )
                logits, hidden = out.logits, (out.last_hidden[:, 0] if needs_hidden else None)
        probs = torch.stack(qs, 1) if qs[0] is not None else None
        tokens_t, valid_t = torch.stack(tokens, 1), torch.stack(valid, 1)
        if sampling.greedy:
            return Draft.chain(tokens_t, valid=valid_t, draft_probs=probs)
        return Draft.chain(tokens_t, valid=valid_t, q=probs)

    def feed_unseen(self, state: DecodeState) -> torch.Tensor:
        """Commit to the draft cache the tokens it has not seen (the pending token, plus any accepted draft tokens
        it does not hold); returns the draft model's logits ``[B, V]`` after each row's pending token."""
        return self.feed_unseen_hidden(state, False)[0]

    def feed_unseen_hidden(self, state: DecodeState, hidden: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        """:meth:`feed_unseen`, plus (with ``hidden``) the final hidden state ``[B, H]`` at each row's pending
        token, else None."""
        seen = self.cache.host_lengths()
        unseen = [n - s for n, s in zip(state.host_lengths, seen)]  # >= 1: the pending token at least
        idx = self.cache.lengths[:, None] + torch.arange(max(unseen), device=state.device)
        tokens_in = state.tokens.gather(1, idx.clamp(max=state.tokens.shape[1] - 1))
        counts = state.lengths - self.cache.lengths
        out = self.model.extend(self.cache, tokens_in, counts, host_counts=unseen, return_hidden=hidden)
        if not hidden:
            return out.logits, None
        last = (counts - 1).clamp(min=0)[:, None, None].expand(-1, 1, out.last_hidden.shape[-1])
        return out.logits, out.last_hidden.gather(1, last)[:, 0]

    def observe(self, state: DecodeState, round: Round) -> None:
        """Drop drafted tokens the target rejected: keep what agrees with the committed history."""
        self.cache.crop(state.lengths - 1, host_lengths=[n - 1 for n in state.host_lengths])

    def select_rows(self, rows: torch.Tensor, host_rows: list[int] | None = None) -> None:
        # with host_rows the cache moves only the rows that change place (no copy of the whole draft cache) and
        # keeps its host lengths valid
        self.cache.select_rows(rows, host_rows=host_rows)
