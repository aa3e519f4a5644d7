"""Length policies: the transformers heuristic schedule, confidence stops and budget capping."""

from __future__ import annotations

import torch

import decodekit as dk
from decodekit.drafters import ModelDrafter
from decodekit.models.tiny import perturbed
from decodekit.policies import ConfidenceStop, FixedLength, HeuristicLength


def test_heuristic_schedule_trace():
    """+2 after a fully accepted draft, -1 otherwise (floor 1), unchanged when nothing was drafted."""
    policy = HeuristicLength(initial=5, max_len=8)
    state = dk.DecodeState.from_prompts([[1], [1], [1]], [100] * 3, dk.SamplingParams(), None, torch.device("cpu"))
    policy.begin(state)
    trace = []
    for drafted, accepted in [([5, 5, 0], [5, 2, 0]), ([7, 4, 0], [7, 0, 0]), ([8, 3, 0], [1, 0, 0])]:
        draft = dk.Draft.chain(
            torch.zeros(3, 8, dtype=torch.long), valid=torch.arange(8) < torch.tensor(drafted)[:, None]
        )
        verdict = dk.Verdict(
            torch.zeros(3, 8, dtype=torch.long), torch.tensor(accepted), torch.zeros(3, dtype=torch.long)
        )
        policy.observe(state, dk.Round(0, draft, verdict, verdict.accepted, verdict.num_accepted + 1))
        trace.append(policy.plan(state).lengths.tolist())
    assert trace == [[7, 4, 5], [8, 3, 5], [7, 2, 5]]
    state.select_rows(torch.tensor([2, 0]), [2, 0])
    policy.select_rows(torch.tensor([2, 0]))
    assert policy.plan(state).lengths.tolist() == [5, 7]


class Recorder:
    """Wraps a drafter and keeps every draft it proposed."""

    def __init__(self, inner):
        self.inner, self.drafts = inner, []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def propose(self, state, budget):
        draft = self.inner.propose(state, budget)
        self.drafts.append((draft, budget))
        return draft


def test_confidence_stop_ends_drafts_after_the_first_unsure_token(target, ragged_prompts):
    threshold, cap = 0.5, 6
    drafter = Recorder(ModelDrafter(perturbed(target, 0.3, seed=1)))
    dk.generate(
        target,
        ragged_prompts,
        drafter,
        policy=ConfidenceStop(threshold, max_len=cap),
        temperature=1.0,
        max_new_tokens=30,
        seed=0,
    )
    saw_short = False
    for draft, budget in drafter.drafts:
        conf = draft.q.gather(-1, draft.tokens[..., None])[..., 0]
        for b in range(draft.batch_size):
            n = int(draft.num_valid[b])
            assert (conf[b, : max(n - 1, 0)] >= threshold).all()  # every token but the last was confident
            if n < int(budget.lengths[b]):
                assert conf[b, n - 1] < threshold  # stopped early only after an unsure token
                saw_short = True
    assert saw_short


def test_budget_is_capped_by_what_rows_may_still_generate(target, ragged_prompts):
    drafter = Recorder(ModelDrafter(target))
    out = dk.generate(target, ragged_prompts, drafter, policy=FixedLength(10), max_new_tokens=7, eos_token_id=())
    assert [len(s) for s in out.sequences] == [7] * 4
    first_round_budget = drafter.drafts[0][1].lengths
    assert first_round_budget.tolist() == [5] * 4  # 7 - 1 (prefill token) - 1 (the bonus token)
