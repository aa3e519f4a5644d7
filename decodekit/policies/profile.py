"""Measure a cost model: a drafter's and the target's seconds per round for each draft length and batch size."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
from tqdm.auto import tqdm

from decodekit.checks import check_bool, check_int
from decodekit.draft import Draft
from decodekit.errors import ConfigError
from decodekit.policies.analytic import CostModel
from decodekit.policies.fixed import FixedLength
from decodekit.spec.state import DecodeState
from decodekit.types import DraftBudget
from decodekit.verifiers import GreedyVerifier

if TYPE_CHECKING:
    from decodekit.spec.round import Round


class _Filler:
    """Drafts exactly the budget's length every round (the pending token repeated): the verification cost of ``k``
    drafted tokens, whatever a real drafter would have found."""

    def propose(self, state: DecodeState, budget: DraftBudget) -> Draft:
        k = budget.max_len
        if k == 0:
            return Draft.empty(state.batch_size, state.device)
        return Draft.chain(state.pending[:, None].expand(-1, k).contiguous(), valid=budget.mask(k))


class _TimedLength(FixedLength):
    """``FixedLength(k)`` that keeps each round's draft seconds (the round record's timings)."""

    needs = frozenset({"timings"})

    def __init__(self, k: int) -> None:
        super().__init__(k)
        self.draft_s: list[float] = []

    def observe(self, state: DecodeState, round: Round) -> None:
        self.draft_s.append(float(round.draft_time_s or 0.0))


def profile_costs(
    model: Any,
    drafter: Any | None,
    prompts: Sequence[Sequence[int]],
    max_len: int = 8,
    batch_sizes: Sequence[int] = (1,),
    new_tokens: int | None = None,
    progress: bool = True,
) -> dict[int, CostModel]:
    """``{batch size: CostModel}`` measured with :func:`decodekit.generate` at greedy decoding.

    For each batch size ``B`` (rows taken from ``prompts``, cycled) and ``k = 0..max_len``: the verify and
    bookkeeping time per round from a filler drafter that always drafts ``k`` tokens (so every round verifies
    ``k + 1`` positions per row), and the draft time per round of ``drafter`` itself under ``FixedLength(k)``, its
    first round of each call left out (where a draft model reads the prompt: a per-call cost, not a per-round one).
    ``2 * (max_len + 1)`` calls of ``new_tokens`` tokens (default ``4 * max_len``) per batch size, after one
    warm-up call each. The loop shortens drafts near a row's last tokens, so ``new_tokens`` must be well above
    ``max_len`` for the long lengths to be measured as such. ``drafter=None`` measures the target alone (every draft
    entry 0, half the calls), for bounds that take drafting as free.
    """
    max_len = check_int("max_len", max_len, low=0)
    progress = check_bool("progress", progress)
    new_tokens = max(4 * max_len, 8) if new_tokens is None else new_tokens
    new_tokens = check_int("new_tokens", new_tokens, low=2 * max_len + 2, hint=" (at least 2 * max_len + 2)")
    if not prompts:
        raise ConfigError("profile_costs needs at least one prompt to time rounds on")
    sizes = [check_int("batch size", b, low=1) for b in batch_sizes]
    bar = tqdm(total=len(sizes) * (max_len + 1), desc="profiling round costs", disable=not progress)
    out: dict[int, CostModel] = {}
    for b in sizes:
        rows = [list(prompts[i % len(prompts)]) for i in range(b)]
        table = []  # (draft, verify, other) seconds per round, k = 0..max_len
        for k in range(max_len + 1):
            filler = _per_round(model, rows, _Filler(), k, new_tokens)
            if drafter is None:
                draft = 0.0
            else:
                draft = (filler if k == 0 else _per_round(model, rows, drafter, k, new_tokens))[0]
            table.append((draft, filler[1], filler[2]))
            bar.update()
        draft, verify, other = zip(*table)
        out[b] = CostModel(tuple(draft), tuple(verify), float(torch.tensor(other).median()))
    bar.close()
    return out


def _per_round(model: Any, rows: list[list[int]], drafter: Any, k: int, new_tokens: int) -> tuple[float, float, float]:
    """``(draft, verify, other)`` seconds per round of one call drafting ``k`` tokens with ``drafter`` (``k = 0``:
    plain decoding), after an identical warm-up call."""
    import decodekit as dk  # the loop imports policies: import it at call time

    for _ in range(2):  # the first call warms up
        policy = _TimedLength(k)
        args = () if k == 0 else (drafter, GreedyVerifier(), policy)
        stats = dk.generate(model, rows, *args, max_new_tokens=new_tokens, eos_token_id=()).stats
    rounds = max(stats.rounds, 1)
    # the steady state: a drafter's first round may also read the prompt (a draft model's lazy prefill), once a call
    steady = policy.draft_s[1:] or policy.draft_s
    draft = sum(steady) / len(steady) if k and steady else stats.draft_time_s / rounds
    return draft, stats.verify_time_s / rounds, stats.other_time_s / rounds
