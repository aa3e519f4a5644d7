"""A separate (small) language model sharing the target's tokenizer drafts a chain autoregressively."""

from __future__ import annotations

from typing import Any

import torch

from decodekit.checks import check_float, check_model_spec
from decodekit.draft import Draft
from decodekit.draft.budget import DraftBudget, stop_needs_hidden
from decodekit.drafters.chain import SamplesLikeTheTarget, draft_chain
from decodekit.models import LanguageModel, load_model
from decodekit.models.vocab_resize import fit_vocab
from decodekit.registry import register
from decodekit.spec.round import Round
from decodekit.spec.state import DecodeState


def unseen_tokens(cache: Any, state: DecodeState, extra: int = 0) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    """The committed tokens a drafter's own ``cache`` does not hold yet (the pending token, plus any accepted draft
    tokens; the whole prompt the first time): ``tokens [B, max(unseen) + extra]`` from each row's cached length on
    (right-padded with whatever follows; ``extra`` more columns for the caller's own), their ``counts [B]`` and the
    same counts on the host (each >= 1). No host sync."""
    unseen = [n - s for n, s in zip(state.host_lengths, cache.host_lengths())]  # >= 1: the pending token at least
    idx = cache.lengths[:, None] + torch.arange(max(unseen) + extra, device=state.device)
    tokens = state.tokens.gather(1, idx.clamp(max=state.tokens.shape[1] - 1))
    return tokens, state.lengths - cache.lengths, unseen


def feed_unseen(
    model: LanguageModel, cache: Any, state: DecodeState, hidden: bool = False
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Commit to a drafter's own ``cache`` of ``model`` the committed tokens it has not seen (:func:`unseen_tokens`),
    in one forward; returns ``model``'s logits ``[B, V]`` after each row's pending token and (with ``hidden``) its
    final hidden state ``[B, H]`` there."""
    tokens_in, counts, unseen = unseen_tokens(cache, state)
    out = model.extend(cache, tokens_in, counts, host_counts=unseen, return_hidden=hidden)
    if not hidden:
        return out.logits, None
    last = (counts - 1).clamp(min=0)[:, None, None].expand(-1, 1, out.last_hidden.shape[-1])
    return out.logits, out.last_hidden.gather(1, last)[:, 0]


@register("drafter", "model")
class ModelDrafter(SamplesLikeTheTarget):
    """Draft with a separate causal LM (speculative sampling's classic drafter).

    The drafter keeps its own :class:`~decodekit.cache.KVCache`. Each round it first feeds the tokens it has not
    seen (the pending token, plus the last accepted draft token when a whole chain was accepted; the first time
    it is called, the whole prompt: the prefill is lazy, so rounds a length policy leaves at ``k = 0`` cost the
    draft model nothing until it drafts again, when it catches up in one forward), then samples
    one token per step, from its logits after the call's logits processors (the target's processing,
    :func:`~decodekit.spec.processors.process_next`). ``q`` of a sampled draft is exactly the distribution it was
    drawn from, so lossless verification needs no assumption; at temperature 0 it drafts the argmax (a
    deterministic draft) and, when a component needs ``"kl"``, reports its softmax in ``Draft.draft_probs``.

    Host syncs: none of its own per round, except one per draft step when the budget has a stop rule (to stop
    early once every row stopped).

    A stop rule with ``needs_hidden = True`` (SpecDec++'s acceptance head, ``ThresholdHeadStop``) gets the draft
    model's final hidden state in :attr:`DraftStep.hidden`: at each step's input token (the pending token at step
    0, then the previous draft token). Only then are hidden states asked of the model.

    A draft model whose output layer is padded to another size than the target's (Qwen2.5-0.5B's 151,936 rows
    for Qwen2.5-7B's 152,064) is taken when the tokenizers show the extra rows to be padding
    (:func:`~decodekit.models.vocab_resize.fit_vocab`): its logits are cut or padded with ``-inf`` to the target's
    size, which keeps verification lossless.

    Args:
        model: the draft model (a :class:`LanguageModel`, a transformers causal LM or a path).
        temperature: sampling temperature of the drafter; None = the call's sampling parameters (temperature,
            top-k, top-p), which maximises acceptance. 0 = argmax drafts.
    """

    needs = frozenset({"host_rows"})  # select_rows gets the kept rows on the host: the cache moves only what changes

    def __init__(self, model: Any, temperature: float | None = None) -> None:
        check_model_spec("model", model)
        self.temperature = check_float("temperature", temperature, low=0, optional=True, hint=" (None = the call's)")
        self.model: LanguageModel = load_model(model)
        self.cache = None

    @property
    def vocab_size(self) -> int:
        return self.model.vocab_size

    def check_model(self, target: LanguageModel) -> None:
        """Fit the draft model's output rows to ``target``'s vocabulary size where the extra rows are padding
        (:func:`~decodekit.models.vocab_resize.fit_vocab`); refuse a draft model of another tokenizer."""
        self.model = fit_vocab(self.model, target, type(self).__name__)

    def begin(self, state: DecodeState) -> None:
        """Allocate the draft model's cache, empty: the prompt is fed with the first round that calls
        :meth:`propose` (a call whose policy never drafts never runs the draft model)."""
        self.cache = self.model.new_cache(state.batch_size, state.tokens.shape[1])

    def propose(self, state: DecodeState, budget: DraftBudget) -> Draft:
        needs_hidden = stop_needs_hidden(budget.stop)
        logits, hidden = self.feed_unseen_hidden(state, needs_hidden)
        if budget.max_len == 0:
            return Draft.empty(state.batch_size, state.device)

        def advance(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
            out = self.model.extend(
                self.cache, x[:, None], torch.ones_like(x), host_counts=1, return_hidden=needs_hidden
            )
            return out.logits, (out.last_hidden[:, 0] if needs_hidden else None)

        return draft_chain(state, budget, self.sampling(state.sampling), logits, hidden, advance)

    def feed_unseen(self, state: DecodeState) -> torch.Tensor:
        """Commit to the draft cache the tokens it has not seen (the pending token, plus any accepted draft tokens
        it does not hold); returns the draft model's logits ``[B, V]`` after each row's pending token."""
        return self.feed_unseen_hidden(state, False)[0]

    def feed_unseen_hidden(self, state: DecodeState, hidden: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        """:meth:`feed_unseen`, plus (with ``hidden``) the final hidden state ``[B, H]`` at each row's pending
        token, else None."""
        return feed_unseen(self.model, self.cache, state, hidden)

    def observe(self, state: DecodeState, round: Round) -> None:
        """Drop drafted tokens the target rejected: keep what agrees with the committed history."""
        self.cache.crop(state.lengths - 1, host_lengths=[n - 1 for n in state.host_lengths])

    def select_rows(self, rows: torch.Tensor, host_rows: list[int] | None = None) -> None:
        # with host_rows the cache moves only the rows that change place (no copy of the whole draft cache) and
        # keeps its host lengths valid
        self.cache.select_rows(rows, host_rows=host_rows)
