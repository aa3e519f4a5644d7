"""RecyclingDrafter: an adjacency matrix of the target's top-k successors, updated from every verified position, and
a breadth-first draft over a static template; plus the ``"logits"`` entry of the round record it relies on."""

from __future__ import annotations

import pytest
import torch

import decodekit as dk
from decodekit.draft.templates import TreeTemplate
from decodekit.drafters import NGramDrafter
from decodekit.drafters.recycling import RecyclingDrafter
from decodekit.policies import FixedLength
from decodekit.verifiers import GreedyVerifier
from tests.conftest import assert_greedy_twice

MAX_NEW = 40
V = 16


def state_of(prompts: list[list[int]]) -> dk.DecodeState:
    lengths = [len(p) + 16 for p in prompts]
    return dk.DecodeState.from_prompts(prompts, lengths, dk.SamplingParams(0.0), None, torch.device("cpu"))


def with_matrix(drafter: RecyclingDrafter, successors: dict[int, list[int]]) -> RecyclingDrafter:
    drafter.matrix = torch.full((V + 1, drafter.k), -1)
    for token, following in successors.items():
        drafter.matrix[token, : len(following)] = torch.tensor(following)
    return drafter


def test_breadth_first_draft_over_the_template():
    template = TreeTemplate([(0,), (1,), (0, 0), (0, 1), (1, 0)])
    drafter = with_matrix(RecyclingDrafter(template, k=2), {3: [4, 5], 4: [6, 7], 5: [8, 9]})
    draft = drafter.propose(state_of([[1, 3]]), dk.DraftBudget(torch.tensor([5])))
    assert draft.tokens.tolist() == [[4, 5, 6, 7, 8]]
    assert draft.parents.tolist() == [[-1, -1, 0, 0, 1]]
    assert draft.valid.all() and draft.kind == dk.DraftKind.DETERMINISTIC


def test_ragged_rows_budgets_and_unknown_tokens():
    template = TreeTemplate.from_branching((2, 2, 1))
    drafter = with_matrix(RecyclingDrafter(template, k=2), {3: [4, 5], 4: [6, 7], 6: [8, 9], 7: [10, 11]})
    prompts = [[1, 3], [3], [2], [0, 3]]  # row 2's pending token was never scored: nothing to draft
    budget = dk.DraftBudget(torch.tensor([10, 3, 10, 10]), torch.tensor([3, 3, 3, 1]), width=2)
    draft = drafter.propose(state_of(prompts), budget)
    draft.check(4, V, budget)  # nodes, depth and width per row
    assert draft.num_valid.tolist() == [6, 3, 0, 2]  # 5 has no successors, so (1, *) stays empty
    keep = draft.valid[0]
    assert draft.tokens[0][keep].tolist() == [4, 5, 6, 7, 8, 10]
    assert draft.parents[0][keep].tolist() == [-1, -1, 0, 0, 2, 3]
    assert draft.tokens[1][draft.valid[1]].tolist() == [4, 5, 6]  # the first 3 template nodes
    assert draft.depth[3].max() == 1
    # a template wider than the budget: truncated to the first children
    narrow = drafter.propose(state_of([[3]]), dk.DraftBudget(torch.tensor([10]), width=1))
    assert narrow.tokens[narrow.valid].tolist() == [4, 6, 8]


def test_nothing_before_the_first_round():
    draft = RecyclingDrafter().propose(state_of([[1, 2]]), dk.DraftBudget(torch.tensor([4])))
    assert draft.num_nodes == 0


def test_matrix_is_replaced_by_every_scored_position():
    drafter = RecyclingDrafter(TreeTemplate.from_branching((2,)), k=2)
    state = state_of([[2, 3]])  # pending token 3
    draft = dk.Draft.tree(torch.tensor([[5, 6, 5]]), torch.tensor([[-1, -1, 0]]), torch.tensor([[True, True, True]]))
    logits = torch.zeros(1, 4, V)
    for row, (a, b) in enumerate([(9, 8), (7, 1), (4, 2), (11, 12)]):  # after 3, after 5, after 6, after 5 again
        logits[0, row, a], logits[0, row, b] = 2.0, 1.0
    state.append(torch.tensor([[5, 7]]), torch.tensor([2]))  # the round accepted node 0, then the target said 7
    verdict = dk.Verdict(
        accepted=torch.tensor([[0, -1, -1]]), num_accepted=torch.tensor([1]), next_token=torch.tensor([7])
    )
    drafter.observe(state, dk.Round(0, draft, verdict, torch.tensor([[5, 7]]), torch.tensor([2]), logits=logits))
    m = drafter.matrix
    assert m.shape == (V + 1, 2) and m.dtype == torch.long
    assert m[3].tolist() == [9, 8] and m[6].tolist() == [4, 2]
    assert m[5].tolist() == [11, 12]  # scored twice: the last position wins, rejected or not
    assert (m[[t for t in range(V) if t not in (3, 5, 6)]] == -1).all()
    drafter.clear()
    assert drafter.matrix is None


@pytest.fixture(scope="module")
def reference(target, ragged_prompts):
    return dk.generate(target, ragged_prompts, max_new_tokens=MAX_NEW, eos_token_id=()).sequences


@pytest.mark.parametrize(
    ("template", "policy"),
    [("smollm2_16", FixedLength(16, depth=5)), ("smollm2_24", FixedLength(8, depth=3, width=2)), ("chain4", None)],
)
def test_greedy_equals_plain_decoding(target, ragged_prompts, reference, template, policy):
    assert_greedy_twice(target, ragged_prompts, RecyclingDrafter(template), policy, reference, MAX_NEW)


def test_rows_finishing_early(target, ragged_prompts, reference):
    eos = reference[0][10]
    expected = dk.generate(target, ragged_prompts, max_new_tokens=MAX_NEW, eos_token_id=eos).sequences
    out = dk.generate(
        target,
        ragged_prompts,
        RecyclingDrafter(),
        policy=FixedLength(12, depth=4),
        max_new_tokens=MAX_NEW,
        eos_token_id=eos,
    )
    assert out.sequences == expected


def test_repetitive_text_gets_accepted(target):
    prompt = [5, 6, 7, 8, 9] * 6
    expected = dk.generate(target, [prompt], max_new_tokens=MAX_NEW, eos_token_id=()).sequences
    out = dk.generate(
        target, [prompt], RecyclingDrafter(), policy=FixedLength(12, depth=4), max_new_tokens=MAX_NEW, eos_token_id=()
    )
    assert out.sequences == expected
    assert out.stats.accepted > 0


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"template": "nope"}, "unknown tree template 'nope'"),
        ({"template": [(0,)]}, "TreeTemplate or a name"),
        ({"template": TreeTemplate([(0,), (1,), (2,)]), "k": 2}, "rank 2"),
        ({"k": 0}, "k must be"),
    ],
)
def test_bad_arguments(kwargs, message):
    with pytest.raises(dk.ConfigError, match=message):
        RecyclingDrafter(**kwargs)


def test_registered_and_asks_for_logits():
    drafter = dk.build("drafter", "recycling")
    assert isinstance(drafter, RecyclingDrafter) and drafter.needs == {"logits"}


# --------------------------------------------------------------------------------------- Round.logits ("logits")
class Recorder:
    """A policy that keeps the rounds it observes; a verifier wrapper keeps the logits it was given."""

    def __init__(self, needs):
        self.needs, self.rounds = frozenset(needs), []

    def plan(self, state):
        return dk.DraftBudget(torch.full_like(state.lengths, 3), node_bound=3)

    def observe(self, state, round):
        self.rounds.append(round)


class LogitsRecorder(GreedyVerifier):
    def __init__(self):
        self.logits = []

    def verify(self, draft, logits, sampling, generator):
        self.logits.append(logits)
        return super().verify(draft, logits, sampling, generator)


@pytest.mark.parametrize("processed", [False, True])
def test_round_logits_are_the_verification_logits(target, ragged_prompts, processed):
    policy, verifier = Recorder({"logits"}), LogitsRecorder()
    extra = {"repetition_penalty": 1.3} if processed else {}
    dk.generate(target, ragged_prompts, NGramDrafter(), verifier, policy, max_new_tokens=12, eos_token_id=(), **extra)
    assert len(policy.rounds) == len(verifier.logits) > 0
    for round, logits in zip(policy.rounds, verifier.logits):
        assert round.logits is logits  # a reference, not a copy
        assert round.logits.shape == (round.draft.batch_size, round.draft.num_nodes + 1, target.config.vocab_size)


def test_round_logits_only_when_asked(target, ragged_prompts):
    policy = Recorder(())
    dk.generate(target, ragged_prompts, NGramDrafter(), policy=policy, max_new_tokens=8, eos_token_id=())
    assert policy.rounds and all(r.logits is None for r in policy.rounds)
