"""The autoregressive draft loop every step-wise chain drafter shares (a draft model, a feature head).

A drafter supplies the logits after each row's pending token and an ``advance(x)`` that feeds the drafted token
and returns the next logits; :func:`draft_chain` does the rest the same way for all of them: the call's logits
processors, argmax or sampling (keyed per step, so per-row seeds hold), the budget's lengths and stop rule, and
the draft's ``q`` (sampled) or reported probabilities (greedy, when a component needs ``"kl"``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from decodekit.draft import Draft, DraftKind
from decodekit.draft.budget import DraftBudget, DraftStep
from decodekit.sampling import probs_from_logits, sample
from decodekit.spec.component_checks import check_target_parts
from decodekit.spec.processors import process_next
from decodekit.spec.state import DecodeState
from decodekit.types import SamplingParams

Advance = Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor | None]]
"""``advance(x [B]) -> (logits [B, V], hidden [B, H] or None)``: feed the drafted tokens, return what follows."""


def draft_chain(
    state: DecodeState,
    budget: DraftBudget,
    sampling: SamplingParams,
    logits: torch.Tensor,
    hidden: torch.Tensor | None,
    advance: Advance,
) -> Draft:
    """Draft ``budget.max_len`` tokens per row (fewer where the budget's stop rule stops every row).

    Args:
        state: the call's state (pending tokens, processors, generator, needs).
        budget: per-row lengths and the optional stop rule.
        sampling: the drafter's sampling parameters (greedy: argmax drafts, a deterministic draft).
        logits: ``[B, V]`` the drafter's logits after each row's pending token (``-inf`` outside a trimmed
            vocabulary: such tokens get probability 0 and are never drafted).
        hidden: ``[B, H]`` the drafter's hidden state that produced ``logits`` (for a stop rule that asks for it),
            or None.
        advance: feeds one drafted token per row (not called after the last).

    Host syncs: one per step when the budget has a stop rule (to stop once every row stopped), none otherwise.
    Without a stop rule, on a budget with host mirrors (``FixedLength``), the draft knows its used width
    (:meth:`~decodekit.draft.Draft.knowing_width`), which spares the loop's trimming sync.
    """
    k = budget.max_len
    report = sampling.greedy and "kl" in state.needs
    alive = budget.lengths > 0
    tokens: list[torch.Tensor] = []
    valid: list[torch.Tensor] = []
    qs: list[torch.Tensor | None] = []
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
            alive = alive & ~budget.stops(step)  # checked: a bool [B]
            if not bool(alive.any()):
                break
        if j + 1 < k:
            logits, hidden = advance(x)
    probs_t = torch.stack(qs, 1) if qs[0] is not None else None  # type: ignore[arg-type]
    tokens_t, valid_t = torch.stack(tokens, 1), torch.stack(valid, 1)
    if sampling.greedy:
        draft = Draft.chain(tokens_t, valid=valid_t, draft_probs=probs_t)
    else:
        draft = Draft.chain(tokens_t, valid=valid_t, q=probs_t)
    return draft if budget.stop is not None else draft.knowing_width(budget.filled_width)  # every row to its length


def draft_block(
    state: DecodeState, budget: DraftBudget, sampling: SamplingParams, logits: torch.Tensor, confidence: float = 0.0
) -> Draft:
    """A chain from one forward's slot logits ``logits [B, m, V]`` (slot ``j`` drafts token ``j + 1``; ``budget``
    at most ``m``): :func:`draft_chain` with each step reading the next slot, the drafted tokens changing nothing
    (block drafters: every draft drawn independently from its own slot's ``q``).

    ``confidence > 0`` (FlexDraft's verification length): row ``b`` keeps its first draft and then drafts ``j``
    while the product of slots ``1 .. j``'s top-1 probabilities (softmax of their logits) is at least
    ``confidence``. The cut depends on the logits only, never on the drafted tokens, so every verifier keeps its
    guarantee; the draft's width is then unknown on the host (the loop's trim reads it: one host sync a round)."""
    done = 0

    def advance(x: torch.Tensor) -> tuple[torch.Tensor, None]:
        nonlocal done
        done += 1
        return logits[:, done], None

    draft = draft_chain(state, budget, sampling, logits[:, 0], None, advance)
    if confidence <= 0:
        return draft
    top1 = logits[:, 1 : draft.num_nodes].float().softmax(-1).amax(-1)  # [B, w - 1]
    first = torch.ones(len(top1), 1, dtype=torch.bool, device=top1.device)
    keep = torch.cat([first, top1.cumprod(1) >= confidence], 1)
    return Draft.chain(draft.tokens, draft.valid & keep, draft.q, draft.kind, draft.draft_probs)


class SamplesLikeTheTarget:
    """For step-wise drafters with a ``temperature`` attribute (None = the call's sampling parameters): the
    drafter's sampling parameters and the kind of draft they give (argmax at temperature 0, else sampled)."""

    temperature: float | None

    def sampling(self, target: SamplingParams) -> SamplingParams:
        """The sampling parameters the drafter uses when the target uses ``target``."""
        if self.temperature is None:
            return target
        return SamplingParams(self.temperature, target.top_k, target.top_p)

    def draft_kind(self, sampling: SamplingParams) -> DraftKind:
        return DraftKind.DETERMINISTIC if self.sampling(sampling).greedy else DraftKind.SAMPLED


class ReadsAHeadPerTarget(SamplesLikeTheTarget):
    """For drafters that read a head file for each target they meet (once per target): ``_read(target)`` returns
    the head and its metadata; :meth:`check_model` (before the call's first forward) loads it, so a head made for
    another target is refused there."""

    head: Any = None

    def _start(self, temperature: float | None, target: Any) -> None:
        """Check ``temperature``; with ``target``, load the head for it now (refusals come here)."""
        from decodekit.checks import check_float

        self.temperature = check_float("temperature", temperature, low=0, optional=True, hint=" (None = the call's)")
        self.head, self._for = None, None
        if target is not None:
            from decodekit.models import load_model

            self._load(load_model(target))

    def _read(self, target: Any) -> tuple[Any, dict[str, Any]]:
        raise NotImplementedError

    def _load(self, target: Any) -> None:
        if self._for != id(target):
            check_target_parts(self, target)
            self.head, self.metadata = self._read(target)
            self._for = id(target)
        self.target = target

    def check_model(self, target: Any) -> None:
        """Before the call's first forward: load the head for ``target`` (refusing one made for another)."""
        self._load(target)
