"""Measure a cost model: a drafter's and the target's seconds per round for each draft length and batch size."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from tqdm.auto import tqdm

from decodekit.checks import check_int
from decodekit.draft import Draft
from decodekit.errors import ConfigError
from decodekit.policies.analytic import CostModel
from decodekit.policies.fixed import FixedLength
from decodekit.state import DecodeState
from decodekit.types import DraftBudget
from decodekit.verifiers import GreedyVerifier


class _Filler:
    """Drafts exactly the budget's length every round (the pending token repeated): the verification cost of ``k``
    drafted tokens, whatever a real drafter would have found."""

    def propose(self, state: DecodeState, budget: DraftBudget) -> Draft:
        k = budget.max_len
        if k == 0:
            return Draft.empty(state.batch_size, state.device)
        return Draft.chain(state.pending[:, None].expand(-1, k).contiguous(), valid=budget.mask(k))


def profile_costs(
    model: Any,
    drafter: Any,
    prompts: Sequence[Sequence[int]],
    max_len: int = 8,
    batch_sizes: Sequence[int] = (1,),
    new_tokens: int | None = None,
    progress: bool = True,
) -> dict[int, CostModel]:
    """``{batch size: CostModel}`` measured with :func:`decodekit.generate` at greedy decoding.

    For each batch size ``B`` (rows taken from ``prompts``, cycled) and ``k = 0..max_len``: the verify and
    bookkeeping time per round from a filler drafter that always drafts ``k`` tokens (so every round verifies
    ``k + 1`` positions per row), and the draft time per round of ``drafter`` itself under ``FixedLength(k)``.
    ``2 * (max_len + 1)`` calls of ``new_tokens`` tokens (default ``4 * max_len``) per batch size, after one
    warm-up call each. The loop shortens drafts near a row's last tokens, so ``new_tokens`` must be well above
    ``max_len`` for the long lengths to be measured as such.
    """
    max_len = check_int("max_len", max_len, low=0)
    new_tokens = max(4 * max_len, 8) if new_tokens is None else new_tokens
    new_tokens = check_int("new_tokens", new_tokens, low=2 * max_len + 2, hint=" (at least 2 * max_len + 2)")
    if not prompts:
        raise ConfigError("profile_costs needs at least one prompt to time rounds on")
    import decodekit as dk  # the loop imports policies: import it at call time

    out: dict[int, CostModel] = {}
    jobs = [(b, k) for b in batch_sizes for k in range(max_len + 1)]
    bar = tqdm(jobs, desc="profiling round costs", disable=not progress)
    per_batch: dict[int, list[tuple[float, float, float]]] = {}
    for b, k in bar:
        rows = [list(prompts[i % len(prompts)]) for i in range(check_int("batch size", b, low=1))]
        timed = []
        for d in (_Filler(), drafter):
            run = dict(max_new_tokens=new_tokens, eos_token_id=())
            if k == 0:
                dk.generate(model, rows, **run)  # warm-up
                stats = dk.generate(model, rows, **run).stats
            else:
                dk.generate(model, rows, d, GreedyVerifier(), FixedLength(k), **run)
                stats = dk.generate(model, rows, d, GreedyVerifier(), FixedLength(k), **run).stats
            rounds = max(stats.rounds, 1)
            timed.append((stats.draft_time_s / rounds, stats.verify_time_s / rounds, stats.other_time_s / rounds))
            if k == 0:
                break
        filler, real = timed[0], timed[-1]
        per_batch.setdefault(b, []).append((real[0], filler[1], filler[2]))
    for b, rows_ in per_batch.items():
        draft, verify, other = zip(*rows_)
        out[b] = CostModel(tuple(draft), tuple(verify), float(torch.tensor(other).median()))
    return out
