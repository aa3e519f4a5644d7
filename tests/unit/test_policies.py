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


class RowCounter(FixedLength):
    """A user's policy that asks for the kept rows on the host (``needs = {"host_rows"}``)."""

    needs = frozenset({"host_rows"})

    def begin(self, state):
        self.calls = []

    def select_rows(self, rows, host_rows=None):
        self.calls.append(host_rows)


def test_a_stack_passes_host_rows_to_the_parts_that_ask_for_them(target, ragged_prompts):
    """Stack took the parts' needs but its select_rows had no host_rows: such a part was refused inside a Stack."""
    first = dk.generate(target, ragged_prompts, max_new_tokens=1, eos_token_id=()).sequences[1][0]  # row 1 stops early
    counter = RowCounter(3)
    policy = dk.policies.Stack(counter, FixedLength(2))
    out = dk.generate(target, ragged_prompts, dk.drafters.NGramDrafter(), policy=policy, max_new_tokens=8,
                      eos_token_id=first)  # fmt: skip
    assert "eos" in out.finish_reasons and counter.calls and all(isinstance(r, list) for r in counter.calls)


class NoChildren(FixedLength):
    def plan(self, state):
        return dk.DraftBudget.uniform(state.lengths, 3, width=0)


def test_a_budget_of_width_zero_drafts_nothing(target, ragged_prompts):
    """Width 0 (no node may have a child) made a chain drafter's draft malformed, blamed on the drafter."""
    draft = dk.load_model(perturbed(target, 0.2, seed=1))
    out = dk.generate(target, ragged_prompts, ModelDrafter(draft), policy=NoChildren(3), max_new_tokens=6)
    assert out.sequences == dk.generate(target, ragged_prompts, max_new_tokens=6).sequences and out.stats.drafted == 0
