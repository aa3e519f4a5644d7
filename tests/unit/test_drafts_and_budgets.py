"""Trees as first-class drafts: node / depth / width budgets (the loop caps depth, never nodes), the three draft
kinds with one kind check before anything runs, and the memory-light q."""

from __future__ import annotations

import pytest
import torch

import decodekit as dk
from decodekit.drafters import DelayedTreeDrafter, ModelDrafter, ModelTreeDrafter, RecyclingDrafter
from decodekit.models.tiny import perturbed, tiny_llama
from decodekit.policies import FixedLength
from decodekit.verifiers import GreedyVerifier, RejectionVerifier
from tests.unit.traces import dummy_state


class PointMassOnly(GreedyVerifier):
    accepts = frozenset({dk.DraftKind.DETERMINISTIC})

    def check(self, sampling):  # usable at any temperature for this test
        pass


def test_three_kinds_and_q_requirements():
    assert {k.value for k in dk.DraftKind} == {"sampled", "sampled_without_replacement", "deterministic"}
    tokens = torch.zeros(1, 2, dtype=torch.long)
    for kind in (dk.DraftKind.SAMPLED, dk.DraftKind.SAMPLED_WITHOUT_REPLACEMENT):
        with pytest.raises(dk.IncompatibleDraftError, match="needs q"):
            dk.Draft.chain(tokens, kind=kind)


def test_kind_is_checked_before_any_compute():
    target = dk.load_model(tiny_llama(0))
    calls = []
    forward = target.forward
    target.forward = lambda *a, **k: calls.append(1) or forward(*a, **k)
    try:
        with pytest.raises(dk.IncompatibleDraftError, match="PointMassOnly cannot verify sampled drafts from Model"):
            dk.generate(target, [[1, 2]], drafter=ModelDrafter(target), verifier=PointMassOnly(), temperature=1.0)
        assert calls == []
    finally:
        del target.forward


class SampledChain:
    """An undeclared drafter whose drafts are SAMPLED (q = uniform)."""

    def propose(self, state, budget):
        tokens = state.pending[:, None].expand(-1, budget.max_len)
        q = torch.full((*tokens.shape, 128), 1 / 128)
        return dk.Draft.chain(tokens, valid=budget.mask(), q=q)


def test_undeclared_kind_is_checked_on_the_first_draft(target):
    with pytest.raises(dk.IncompatibleDraftError, match="cannot verify sampled drafts from SampledChain"):
        dk.generate(target, [[1, 2]], drafter=SampledChain(), verifier=PointMassOnly(), max_new_tokens=5)


def test_undeclared_kind_is_checked_even_after_empty_drafts(target):
    class LateSampler(SampledChain):
        rounds = 0

        def propose(self, state, budget):
            self.rounds += 1
            if self.rounds < 3:  # nothing to propose at first
                return dk.Draft.empty(state.batch_size)
            return super().propose(state, budget)

    with pytest.raises(dk.IncompatibleDraftError, match="cannot verify sampled drafts from LateSampler"):
        dk.generate(target, [[1, 2]], drafter=LateSampler(), verifier=PointMassOnly(), max_new_tokens=8)


def test_declared_kind_must_match_the_drafts(target):
    class Liar(SampledChain):
        def draft_kind(self, sampling):
            return dk.DraftKind.DETERMINISTIC

    with pytest.raises(dk.IncompatibleDraftError, match="said deterministic but it returned a sampled draft"):
        dk.generate(target, [[1, 2]], drafter=Liar(), max_new_tokens=5)


class BranchyTree:
    """Each round: a tree of ``width`` siblings per level (greedy guesses from the target and decoys) filling the
    node budget down to the depth budget. Records the budgets it was given."""

    def __init__(self, target, width: int = 2):
        self.target, self.width, self.budgets = target, width, []

    def draft_kind(self, sampling):
        return dk.DraftKind.DETERMINISTIC

    def propose(self, state, budget):
        self.budgets.append((budget.nodes.tolist(), budget.depth_or_nodes.tolist(), budget.width))
        rows = []
        for b in range(state.batch_size):
            history = state.tokens[b, : state.host_lengths[b]].tolist()
            depth, nodes = int(budget.depth_or_nodes[b]), int(budget.nodes[b])
            rows.append(self._tree(history, depth, nodes))
        n = max(len(r) for r in rows)
        tokens = torch.zeros(state.batch_size, max(n, 1), dtype=torch.long)
        parents = torch.full_like(tokens, -1)
        valid = torch.zeros_like(tokens, dtype=torch.bool)
        for b, row in enumerate(rows):
            for i, (tok, par) in enumerate(row):
                tokens[b, i], parents[b, i], valid[b, i] = tok, par, True
        return dk.Draft.tree(tokens, parents, valid)

    def _tree(self, history, depth, nodes):
        out, parent = [], -1
        with torch.no_grad():
            for _ in range(depth):
                logits = self.target(torch.tensor([history])).logits[0, -1]
                best = int(logits.argmax())
                for decoy in range(1, self.width):  # decoy siblings first: the true path is not contiguous
                    if len(out) < nodes:
                        out.append(((best + decoy) % 128, parent))
                if len(out) >= nodes:
                    break
                out.append((best, parent))
                parent = len(out) - 1
                history = history + [best]
        return out


def test_loop_caps_depth_not_nodes(target, ragged_prompts):
    drafter = BranchyTree(target)
    policy = lambda: None  # noqa: E731
    policy = type(
        "P",
        (),
        {
            "plan": lambda self, s: dk.DraftBudget(
                torch.full_like(s.lengths, 9), torch.full_like(s.lengths, 4), width=2, node_bound=9, depth_bound=4
            )
        },
    )()
    out = dk.generate(target, ragged_prompts, drafter=drafter, policy=policy, max_new_tokens=6, debug=True)
    plain = dk.generate(target, ragged_prompts, max_new_tokens=6)
    assert out.sequences == plain.sequences
    first_nodes, first_depth, width = drafter.budgets[0]
    assert first_nodes == [9] * len(ragged_prompts) and first_depth == [4] * len(ragged_prompts) and width == 2
    assert out.stats.mean_acceptance_length > 3  # the true path is accepted through the decoys
    for nodes, depth, _ in drafter.budgets[1:]:
        assert nodes == [9] * len(nodes)  # the node budget is never capped ...
        assert max(depth) < 4  # ... the depth is, near each row's end (6 new tokens: at most 5 per round)


@pytest.mark.parametrize(
    ("parents", "budget", "message"),
    [
        ([-1, 0, 1, 2], dict(nodes=3), "more nodes than its budget"),
        ([-1, 0, 1, 2], dict(nodes=4, depth=3), "deeper tree than its budget"),
        ([-1, -1, -1, 0], dict(nodes=4, width=2), "more than budget.width=2 children"),
        ([-1, 0, 0, 0], dict(nodes=4, width=2), "more than budget.width=2 children"),
        ([-1, 2, 0, 1], dict(nodes=4), "parents-first"),
    ],
)
def test_check_refuses_drafts_outside_the_budget(parents, budget, message):
    draft = dk.Draft.tree(torch.ones(1, 4, dtype=torch.long), torch.tensor([parents]), torch.ones(1, 4, dtype=bool))
    fields = {k: torch.tensor([v]) for k, v in budget.items() if k != "width"}
    with pytest.raises(dk.ConfigError, match=message):
        draft.check(1, 128, dk.DraftBudget(**fields, width=budget.get("width")))
    ok = dk.DraftBudget(torch.tensor([4]), torch.tensor([4]), width=3)
    if message != "parents-first":
        draft.check(1, 128, ok)


def test_chain_with_a_gap_in_valid_is_refused():
    draft = dk.Draft.chain(torch.ones(1, 3, dtype=torch.long), valid=torch.tensor([[True, False, True]]))
    with pytest.raises(dk.ConfigError, match="a valid parent|prefix mask"):
        draft.check(1, 128, dk.DraftBudget(torch.tensor([3])))


def test_memory_light_q_is_the_per_node_q():
    """q per parent + q_index: node_q(), q_of_tokens() and rejection sampling equal the per-node form."""
    gen = torch.Generator().manual_seed(0)
    q_rows = torch.rand(2, 3, 8, generator=gen).softmax(-1)  # [B, P, V], stored in a shuffled order
    q_index = torch.tensor([[2, 0, 1], [1, 2, 0]])
    tokens = torch.randint(0, 8, (2, 3), generator=gen)
    light = dk.Draft.chain(tokens, q=q_rows, kind=dk.DraftKind.SAMPLED)
    light = dk.Draft(light.tokens, light.parents, light.valid, dk.DraftKind.SAMPLED, q_rows, q_index)
    per_node = q_rows.gather(1, q_index[..., None].expand(-1, -1, 8))
    full = dk.Draft.chain(tokens, q=per_node)
    torch.testing.assert_close(light.node_q(), per_node)
    torch.testing.assert_close(light.q_of_tokens(), full.q_of_tokens())
    logits = torch.randn(2, 4, 8, generator=gen)
    sampling = dk.SamplingParams(1.0)
    a = RejectionVerifier().verify(light, logits, sampling, torch.Generator().manual_seed(5))
    b = RejectionVerifier().verify(full, logits, sampling, torch.Generator().manual_seed(5))
    assert torch.equal(a.num_accepted, b.num_accepted) and torch.equal(a.next_token, b.next_token)
    with pytest.raises(dk.ConfigError, match="q_index must be"):
        dk.Draft(tokens, light.parents, light.valid, dk.DraftKind.SAMPLED, q_rows, q_index[:, :2])


def test_host_mirrors_give_exact_lengths_and_follow_the_cap():
    """A budget's host mirrors (FixedLength gives them) make the lengths host-known; the loop's cap keeps them
    equal to the capped tensors; a budget without them reads the tensors."""
    budget = dk.DraftBudget(torch.tensor([5, 5, 5]), torch.tensor([3, 3, 3]), host_nodes=(5, 5, 5), host_depth=(3,) * 3)
    capped = budget.capped(torch.tensor([4, 1, -1]), 4, [4, 1, -1])
    assert capped.host_values() == (capped.nodes.tolist(), capped.depth.tolist()) == ([5, 5, 5], [3, 1, 0])
    assert capped.host_lengths == [3, 1, 0] and capped.max_len == 3
    capped.check(3, torch.device("cpu"), values=True)  # the mirrors agree with the tensors
    assert budget.capped(torch.tensor([4, 1, -1]), 4).host_lengths is None  # no host caps: no mirrors
    plain = dk.DraftBudget(torch.tensor([2, 6]), torch.tensor([5, 1]))
    assert plain.host_lengths is None and plain.host_values() == ([2, 6], [5, 1]) and plain.max_len == 5
    mirrored = dk.DraftBudget(torch.tensor([2, 6]), torch.tensor([5, 1]), host_nodes=(2, 6), host_depth=(5, 1))
    assert mirrored.max_len == 2  # exact: max over rows of min(nodes, depth)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (dict(host_nodes=(4,)), "tuple of 2 ints"),
        (dict(host_nodes=[4, 4]), "tuple of 2 ints"),
        (dict(host_nodes=(4, 4.0)), "tuple of 2 ints"),
        (dict(host_nodes=(4, 4), host_depth=(2, 2)), "give depth too"),
        (dict(depth=torch.tensor([2, 2]), host_depth=(2, 2)), "needs host_nodes"),
    ],
)
def test_malformed_host_mirrors_are_refused(fields, message):
    with pytest.raises(dk.ConfigError, match=message):
        dk.DraftBudget(torch.tensor([4, 4]), **fields)


def test_host_mirrors_that_disagree_with_the_tensors_are_caught_when_checked(target):
    """A policy whose host mirrors lie is refused by ``debug=True`` (the values check), naming the mirror."""

    class Lying:
        def plan(self, state):
            nodes = torch.full_like(state.lengths, 2)
            return dk.DraftBudget(nodes, node_bound=3, host_nodes=(3,) * state.batch_size)

    with pytest.raises(dk.ConfigError, match=r"host_nodes \[3\] differs from nodes"):
        dk.generate(target, [[1, 2, 3]], drafter=ModelDrafter(target), policy=Lying(), max_new_tokens=8, debug=True)


def test_a_declared_width_is_trusted_by_trimming_and_checked_by_debug():
    valid = torch.tensor([[True, True, False, False], [True, False, False, False]])
    draft = dk.Draft.chain(torch.ones(2, 4, dtype=torch.long), valid=valid)
    assert draft.used_width == 2 and draft.trimmed().num_nodes == 2
    told = dk.Draft.chain(torch.ones(2, 4, dtype=torch.long), valid=valid).knowing_width(2)
    assert told.trimmed().num_nodes == 2
    told.check(2, 128, dk.DraftBudget(torch.tensor([4, 4])))
    wrong = dk.Draft.chain(torch.ones(2, 4, dtype=torch.long), valid=valid).knowing_width(4)
    with pytest.raises(dk.ConfigError, match="declared a used width of 4"):
        wrong.check(2, 128, dk.DraftBudget(torch.tensor([4, 4])))


def test_a_declared_bound_on_the_width_trims_there_and_is_checked_by_debug():
    valid = torch.tensor([[True, True, False, False], [True, False, False, False]])
    parents = torch.tensor([[-1, 0, 1, 2], [-1, 0, 1, 2]])

    def tree():
        return dk.Draft.tree(torch.ones(2, 4, dtype=torch.long), parents, valid)

    bounded = tree().knowing_width(3, exact=False)
    assert bounded.trimmed().num_nodes == 3  # a column no row uses may stay: a bound, not the width
    bounded.check(2, 128, dk.DraftBudget(torch.tensor([4, 4])))
    assert tree().knowing_width(None).trimmed().num_nodes == 2  # nothing known: read
    with pytest.raises(dk.ConfigError, match="valid nodes past the bound on its width it declared, 1"):
        tree().knowing_width(1, exact=False).check(2, 128, dk.DraftBudget(torch.tensor([4, 4])))


def test_filled_width_is_known_only_from_host_mirrors():
    assert FixedLength(3).plan(dummy_state(2)).filled_width == 3
    capped = dk.DraftBudget(torch.tensor([4, 2]), node_bound=4, host_nodes=(4, 2)).capped_at(3)
    assert capped.filled_width == 3 and capped.mask().tolist() == [[True] * 3, [True, True, False]]
    assert dk.DraftBudget(torch.tensor([4, 2]), node_bound=4).filled_width is None  # the bound may be loose


def test_host_tree_width_is_the_most_columns_a_row_can_fill():
    nodes, depth = torch.tensor([3, 7, 2]), torch.tensor([4, 1, 4])
    budget = dk.DraftBudget(nodes, depth, host_nodes=(3, 7, 2), host_depth=(4, 1, 4))
    assert budget.host_tree_width([2, 4, 4]) == 3  # rows: min(3, 10), min(7, 2), min(2, 10)
    assert budget.host_tree_width([1]) == 1  # a one-level shape offers one column
    assert dk.DraftBudget(nodes, depth).host_tree_width([2, 4]) is None  # no mirrors: unknown


TREES = {
    "dynamic": lambda target: ModelTreeDrafter(target, shape="dynamic", top_k=2),
    "template": lambda target: ModelTreeDrafter(target, shape="template", template="smollm2_8"),
    "iid": lambda target: ModelTreeDrafter(target, shape="iid", branches=2),
    "without_replacement": lambda target: ModelTreeDrafter(target, shape="without_replacement", branches=3),
    "delayed": lambda target: DelayedTreeDrafter(target, branches=2, trunk=2, branch_length=1),
    "recycling": lambda target: RecyclingDrafter(),
}


@pytest.mark.parametrize("drafter", ["model", "suffix", *TREES])
def test_drafters_on_host_mirrored_budgets_are_greedy_decoding_to_the_last_token(target, ragged_prompts, drafter):
    """Drafts that declare their width (chains to a mirrored budget, suffix lookup) or a bound on it (trees) near
    each row's end, where the loop caps the depth per row: every declaration holds (``debug=True`` checks it) and
    the output is plain decoding's."""
    from decodekit.drafters import SuffixDrafter

    if drafter in TREES:
        built, policy = TREES[drafter](target), FixedLength(6, depth=3)
    else:
        built = ModelDrafter(target) if drafter == "model" else SuffixDrafter(cache_tokens=0)
        policy = FixedLength(4)
    plain = dk.generate(target, ragged_prompts, max_new_tokens=11)
    out = dk.generate(target, ragged_prompts, drafter=built, policy=policy, max_new_tokens=11, debug=True)
    assert out.sequences == plain.sequences and out.stats.rounds < sum(map(len, plain.sequences))


@pytest.mark.parametrize("drafter", sorted(TREES))
def test_trees_on_adaptive_per_row_budgets_keep_their_width_bounds(target, ragged_prompts, drafter):
    """An adaptive tree budget (per-row depth and nodes, from the cost model) mirrored on the host: each row's
    bound holds (``debug``) and the output is plain decoding's."""
    from decodekit.policies import CostModel, GoodputLength

    policy = GoodputLength(CostModel.relative(0.05, 6), nodes_per_depth=3, probe_every=0)
    plain = dk.generate(target, ragged_prompts, max_new_tokens=16)
    out = dk.generate(
        target, ragged_prompts, drafter=TREES[drafter](target), policy=policy, max_new_tokens=16, debug=True
    )
    assert out.sequences == plain.sequences and out.stats.drafted > 0


@pytest.mark.parametrize("drafter", sorted(TREES))
def test_sampled_trees_keep_their_width_bounds(target, ragged_prompts, drafter):
    """Sampled (and with a zero-probability tail: top-k 3), every round's declared bound holds under ``debug``."""
    built = TREES[drafter](perturbed(target, 0.3, seed=2) if drafter != "recycling" else target)
    dk.generate(
        target,
        ragged_prompts,
        drafter=built,
        policy=FixedLength(6, depth=3),
        max_new_tokens=11,
        temperature=1.0,
        top_k=3,
        seed=0,
        debug=True,
    )
