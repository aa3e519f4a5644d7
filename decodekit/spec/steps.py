"""The steps of a round that :func:`decodekit.generate`'s loop runs in order around the target's forward:
:func:`propose` (the policy's budget, capped so no round passes a row's limit, spent by the drafter, checked), then,
once the verifier decided, :func:`round_tokens` (what the round commits) and :func:`kept_slots` (what the cache
keeps)."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import torch

from decodekit.draft import Draft
from decodekit.spec.component_checks import check_untouched, explain_failure
from decodekit.spec.round import kept_inputs
from decodekit.spec.state import DecodeState
from decodekit.types import Verdict

if TYPE_CHECKING:
    from decodekit.spec.components import Components


def propose(parts: Components, state: DecodeState, debug: bool, index: int | None = None) -> Draft:
    """This round's draft (round ``index``): the policy's budget, its depth capped so no round passes a row's limit,
    spent by the drafter; its values validated every round with ``debug`` (else the budget's on the first round, the
    draft's until the first non-empty one); unused columns trimmed."""
    if parts.drafter is None:
        return empty_draft(state.batch_size, state.device)
    validate = debug or parts.unchecked
    caps = [r - 1 for r in state.host_remaining]
    before = state.stamp()
    budget = parts.plan(state, debug)
    check_untouched(before, state, parts.policy, "plan")
    budget = budget.capped(state.remaining - 1, max(caps, default=-1), caps)
    parts.check_budget_size(budget)
    if budget.max_depth == 0 or budget.max_len == 0 or budget.width == 0:  # width 0: no node may have a child
        return empty_draft(state.batch_size, state.device)
    try:
        draft = parts.drafter.propose(state, budget)
    except (IndexError, RuntimeError) as error:  # a draft model fed a pending token outside its vocabulary
        explain_failure(parts, error, state, round_index=index)
        raise
    check_untouched(before, state, parts.drafter, "propose")
    parts.check_draft(draft, state, budget, values=validate)
    return draft.trimmed() if draft.num_nodes else draft


@functools.lru_cache(maxsize=64)
def empty_draft(batch_size: int, device: torch.device) -> Draft:
    return Draft.empty(batch_size, device)


def kept_slots(draft: Draft, verdict: Verdict) -> torch.Tensor | None:
    """Staged slots the cache keeps: the pending token (slot 0) and the accepted path; None for chains (a prefix)."""
    return None if draft.is_chain else kept_inputs(verdict)


def round_tokens(draft: Draft, verdict: Verdict) -> tuple[torch.Tensor, torch.Tensor]:
    """What a round commits per row: the accepted path then the next pending token (``[B, M]``, counts ``[B]``)."""
    num, nxt = verdict.num_accepted, verdict.next_token[:, None]
    if draft.num_nodes == 0:
        return nxt, num + 1
    path = draft.tokens.gather(1, verdict.accepted.clamp(min=0))
    return torch.cat([path, nxt], 1).scatter(1, num[:, None], nxt), num + 1


__all__ = ["empty_draft", "kept_slots", "propose", "round_tokens"]
