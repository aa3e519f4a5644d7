"""One step of the diffusion sampler on a forward's logits (:func:`take_step`): proposals, the schedule's region,
the rule's commits written into the canvas, and the one host read that says how many masked slots each row has left
in its block; a step that leaves a row stuck raises, naming the part at fault (:func:`no_progress`)."""

from __future__ import annotations

from typing import Any, NamedTuple

import torch

from decodekit.dlm.components import check_commit, check_region
from decodekit.dlm.parts import Parts
from decodekit.dlm.state import DLMState, Proposal, propose, restrict
from decodekit.errors import ComponentOutputError, NoProgressError
from decodekit.sampling import begin_round


class Step(NamedTuple):
    """One step of the sampler: its proposals, the slots it committed (``[B, G]`` bool), each row's masked slots
    left in its block (host ints) and the rows that took it (``[B]`` bool; None: every row)."""

    proposal: Proposal
    commit: torch.Tensor
    left: list[int]
    rows: torch.Tensor | None = None


def take_step(
    state: DLMState, parts: Parts, logits: Any, temperature: float, left: list[int], live: list[bool]
) -> Step:
    """One step on ``logits`` (the canvas's: ``[B, G, V]`` or a :class:`~decodekit.dlm.state.SlotLogits` window) in
    the ``live [B]`` rows (host bools; the others wait for the next forward). ``left``: each row's masked slots in its
    block before the step (host ints). While the loop looks ahead, only the current block's logits count."""
    rows = None if all(live) else torch.tensor(live, device=state.device)  # [B] bool: some rows wait
    if state.lookahead is not None:
        logits = restrict(logits, *state.block)
    return _one_step(state, parts, logits, temperature, left, live, rows)


def _one_step(
    state: DLMState,
    parts: Parts,
    logits: Any,
    temperature: float,
    left: list[int],
    live: list[bool],
    rows: torch.Tensor | None,
) -> Step:
    """One step of the sampler on ``logits`` (the current canvas's): proposals, the rule's commits, written into the
    canvas, in the ``live [B]`` rows only (host bools; ``rows``: the same on the device, None when all are live; the
    others wait for the next forward, their step counters stay). One host read: each row's masked slots left in its
    block, and whether it committed a token (a live row that had and still has masked slots in its block but
    committed none would never finish: :class:`~decodekit.errors.NoProgressError`, naming the part at fault)."""
    begin_round(state.generator, state.row_steps)
    proposal = propose(logits, temperature, state)
    region = parts.schedule.region(state, proposal)
    eligible = state.masked & check_region(f"{type(parts.schedule).__name__}.region", region, state)
    if state.step == 0 and parts.declared.begins_block:
        parts.rule.begin_block(state)
    chosen = parts.rule.select(state, proposal, eligible)
    commit = check_commit(f"{type(parts.rule).__name__}.select", chosen, state) & state.masked
    if rows is not None:
        commit, eligible = commit & rows[:, None], eligible & rows[:, None]
    state.block_step += 1 if rows is None else rows
    unmasked = commit & (proposal.tokens != state.mask_token_id)  # a slot committed with the mask id stays masked
    vocab = proposal.logits.shape[-1]
    outside = (commit & ((proposal.tokens < 0) | (proposal.tokens >= vocab))).any(1)  # a rule rewrote tokens badly
    state.commit(commit, proposal.tokens)
    if parts.declared.slides:  # the window moves on after a commit: a row is live while it has one
        parts.schedule.region(state, proposal)
    state.row_steps[:] = [n + int(k > 0 and on) for n, k, on in zip(state.row_steps, left, live)]
    state.step += 1
    state.global_step += 1
    now = torch.cat([(state.masked & state.in_block).sum(1), (~unmasked.any(1)).long(), outside.long()]).tolist()
    b = state.batch_size
    if any(now[2 * b :]):
        rows_out = [i for i in range(b) if now[2 * b + i]][:8]
        raise ComponentOutputError(
            f"{type(parts.rule).__name__}.select committed token ids outside the vocabulary [0, {vocab}) in row(s) "
            f"{rows_out} (step {state.step}); a rule that rewrites proposal.tokens must write ids of the vocabulary"
        )
    stuck = [i for i in range(b) if now[b + i] and live[i] and left[i] > 0 and now[i] > 0]
    if stuck:
        no_progress(parts, state, stuck, eligible, commit)
    return Step(proposal, commit, now[:b], rows)


def no_progress(parts: Parts, state: DLMState, stuck: list[int], eligible: torch.Tensor, commit: torch.Tensor) -> None:
    """Raise the :class:`~decodekit.errors.NoProgressError` of a step that left the ``stuck`` rows as they were,
    naming the part at fault (raising anyway: the device reads are free)."""
    rows = torch.tensor(stuck, device=state.device)
    had, chose = eligible[rows].any(1).tolist(), commit[rows].any(1).tolist()
    where = f"(step {state.step}); the loop would never end"
    if not all(had):
        empty = [r for r, h in zip(stuck, had) if not h][:8]
        raise NoProgressError(
            f"{type(parts.schedule).__name__}.region named no masked slot of row(s) {empty}, which still have masked "
            f"slots in their block (state.in_block) {where}; a schedule's region must hold each row's masked slots of "
            "its block, or move the block on"
        )
    if not all(chose):
        idle = [r for r, c in zip(stuck, chose) if not c][:8]
        raise NoProgressError(
            f"{type(parts.rule).__name__}.select committed nothing in row(s) {idle}, which still have masked slots "
            f"in their block {where}; a rule must commit at least one eligible slot per row and step"
        )
    raise NoProgressError(
        f"{type(parts.rule).__name__}.select committed only slots without a proposal in row(s) {stuck[:8]} {where}: "
        "proposal.tokens is the mask id there (slots outside the window the cache's logits predicted, "
        f"{type(parts.cache).__name__}); a rule must commit at least one eligible slot per row and step"
    )


def keep(last: Step, step: Step, rows: torch.Tensor) -> Step:
    """Each row's latest step: ``step``'s in the ``rows [B]`` (bool) that took it, ``last``'s in the others (what a
    row's drafts for the next forward come from)."""
    old, new = last.proposal, step.proposal
    proposal = Proposal(
        torch.where(rows[:, None], new.tokens, old.tokens),
        torch.where(rows[:, None], new.confidence, old.confidence),
        torch.where(rows[:, None, None], new.logits, old.logits),
        new.lo,
    )
    return Step(proposal, torch.where(rows[:, None], step.commit, last.commit), step.left, step.rows)


__all__ = ["Step", "keep", "no_progress", "take_step"]
