"""Tree drafts from a separate draft model (ModelTreeDrafter's shapes, a static template, DelayedTreeDrafter).

* Structure: on a ragged batch with ragged per-row budgets, every round's draft is within its budget, has the
  declared kind and layout (rollouts, distinct siblings, a trunk with one child per node), and ``q`` (or the reported
  ``draft_probs``) of every node is the draft model's own distribution after that node's parent, recomputed with a
  plain transformers forward of the path (so the staged tree forwards, their masks and positions, and the draft cache
  kept across rounds are right).
* Greedy equality with plain decoding for every shape, with drafts accepted (so the equality is not vacuous); a
  draft model equal to the target accepts whole rollouts every round.
* Sampling: the first 3 tokens follow the target's exact law with tree verifiers (as ``test_lossless.py``); per-row
  seeds keep a row's output independent of its batch.
"""

from __future__ import annotations

import pytest
import torch
from transformers import RepetitionPenaltyLogitsProcessor

import decodekit as dk
from decodekit.draft.templates import TreeTemplate
from decodekit.drafters import DelayedTreeDrafter, ModelTreeDrafter
from decodekit.errors import ConfigError
from decodekit.models.tiny import perturbed, tiny_llama
from decodekit.policies import FixedLength
from decodekit.sampling import probs_from_logits
from decodekit.verifiers import GreedyVerifier, SpecInferVerifier, TraversalVerifier
from tests.unit.test_host_syncs import count_syncs
from tests.unit.test_lossless import PROMPTS, ROWS_PER_PROMPT, SETTINGS, VOCAB, assert_matches

MAX_NEW = 16
TEMPLATE = TreeTemplate([(0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0)])
SHAPES = {
    "iid": lambda m, **kw: ModelTreeDrafter(m, shape="iid", branches=3, **kw),
    "without_replacement": lambda m, **kw: ModelTreeDrafter(m, shape="without_replacement", branches=3, **kw),
    "dynamic": lambda m, **kw: ModelTreeDrafter(m, shape="dynamic", top_k=4, **kw),
    "delayed": lambda m, **kw: DelayedTreeDrafter(m, branches=2, trunk=2, branch_length=2, **kw),
    "template": lambda m, **kw: ModelTreeDrafter(m, shape="template", template=TEMPLATE, **kw),
}


class RaggedTree:
    """Per-row tree budgets: nodes, depth and the width cap differ from row to row."""

    def plan(self, state: dk.DecodeState) -> dk.DraftBudget:
        row = torch.arange(state.batch_size) % 4
        nodes, depth = torch.tensor([8, 5, 2, 7])[row], torch.tensor([4, 3, 3, 2])[row]
        return dk.DraftBudget(nodes, depth, width=3)


class Recorder:
    """Wraps a drafter in ``generate``: checks each draft against its budget and keeps it with each row's context."""

    def __init__(self, inner, needs=frozenset()) -> None:
        self.inner, self.needs, self.rounds = inner, frozenset(needs), []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def propose(self, state, budget):
        draft = self.inner.propose(state, budget)
        draft.check(state.batch_size, self.inner.vocab_size, budget)
        contexts = [state.tokens[b, :n].tolist() for b, n in enumerate(state.host_lengths)]
        self.rounds.append((contexts, budget, draft))
        return draft


def paths(draft: dk.Draft, b: int) -> list[list[int]]:
    """Row ``b``: the node indices from the root down to each node (inclusive)."""
    out: list[list[int]] = []
    for i, p in enumerate(draft.parents[b].tolist()):
        out.append([*out[p], i] if p >= 0 else [i])
    return out


def reference(model, context: list[int], sampling: dk.SamplingParams, penalty: float | None) -> torch.Tensor:
    """The draft model's distribution ``[V]`` after ``context``: a plain transformers forward."""
    with torch.no_grad():
        logits = model(torch.tensor([context])).logits[:, -1].float()
    if penalty is not None:
        logits = RepetitionPenaltyLogitsProcessor(penalty)(torch.tensor([context]), logits)
    return logits[0].softmax(-1) if sampling.greedy else probs_from_logits(logits[0], sampling)


@pytest.mark.parametrize("sampled", [True, False], ids=["T0.8-p0.9-penalty", "greedy"])
@pytest.mark.parametrize("shape", list(SHAPES))
def test_structure_and_q(target, ragged_prompts, shape, sampled):
    draft_model = perturbed(target, 0.3, seed=1)
    drafter = Recorder(SHAPES[shape](draft_model), needs={"kl"})
    settings = dict(temperature=0.8, top_p=0.9, repetition_penalty=1.5, seed=[5, 6, 7, 8]) if sampled else {}
    dk.generate(target, ragged_prompts, drafter, TraversalVerifier(), RaggedTree(), max_new_tokens=6, **settings)
    sampling = dk.SamplingParams(0.8, None, 0.9) if sampled else dk.SamplingParams(0.0)
    kind = drafter.draft_kind(sampling)
    assert kind == {
        "iid": dk.DraftKind.SAMPLED,
        "without_replacement": dk.DraftKind.SAMPLED_WITHOUT_REPLACEMENT,
        "delayed": dk.DraftKind.SAMPLED,
    }.get(shape if sampled else "", dk.DraftKind.DETERMINISTIC)
    for contexts, budget, draft in drafter.rounds[:3]:  # later rounds: shorter depth budgets, same code
        assert draft.kind == kind
        probs = draft.reported_probs()
        assert torch.allclose(probs.sum(-1)[draft.valid], torch.ones(()), atol=1e-5)
        for b, context in enumerate(contexts):
            check_row(draft, b, budget, shape, sampled)
            if shape == "dynamic":
                check_rerank(draft, b, probs)
            for i, path in enumerate(paths(draft, b)):
                if draft.valid[b, i]:
                    prefix = context + draft.tokens[b, path[:-1]].tolist()
                    expected = reference(draft_model, prefix, sampling, 1.5 if sampled else None)
                    torch.testing.assert_close(probs[b, i], expected, atol=2e-5, rtol=1e-4)
                    if shape == "template" or (not sampled and shape != "dynamic"):  # top-ranked children
                        rank = (draft.parents[b, :i] == draft.parents[b, i]).logical_and(draft.valid[b, :i]).sum()
                        assert draft.tokens[b, i] == expected.topk(int(rank) + 1).indices[-1]


def check_rerank(draft: dk.Draft, b: int, probs: torch.Tensor) -> None:
    """Row ``b`` of a dynamic tree: every kept node's path probability is at least that of any of the root's
    top-3 children (all of them candidates) that was left out."""
    tokens, valid = draft.tokens[b], draft.valid[b]
    score = [float(probs[b, path, tokens[path]].prod()) for path in paths(draft, b)]
    root = [i for i in range(draft.num_nodes) if valid[i] and draft.parents[b, i] < 0]
    top = probs[b, root[0]].topk(3)
    left = [float(p) for p, t in zip(top.values, top.indices) if t not in tokens[root]]
    kept = [s for s, v in zip(score, valid) if v]
    assert not left or min(kept) >= max(left) - 1e-6


def check_row(draft: dk.Draft, b: int, budget: dk.DraftBudget, shape: str, sampled: bool) -> None:
    """The tree of row ``b`` has the shape's layout and uses its budget."""
    valid = draft.valid[b]
    nodes, depth = int(budget.nodes[b]), int(budget.depth_or_nodes[b])
    parents = draft.parents[b][valid].tolist()
    children = {p: [i for i, q in enumerate(draft.parents[b].tolist()) if q == p and valid[i]] for p in [-1, *parents]}
    tokens = draft.tokens[b].tolist()
    if shape in ("dynamic", "without_replacement", "template") or not sampled:  # distinct siblings
        assert all(len({tokens[i] for i in c}) == len(c) for c in children.values())
    if shape == "template":  # the template's shallowest nodes within the row's budget, in its order
        within = [i for i, c in enumerate(TEMPLATE.choices) if len(c) <= depth][:nodes]
        assert draft.parents[b].tolist() == TEMPLATE.parents[: draft.num_nodes].tolist()  # fitted: a prefix
        if sampled:  # top-p may leave a rank out, and everything under it
            assert set(valid.nonzero().flatten().tolist()) <= set(within) and valid[0]
        else:
            assert valid.nonzero().flatten().tolist() == within
        return
    if shape == "dynamic":  # 3 children (top_k=4 capped by the width) of each of the 4 best frontier nodes
        candidates = 0 if depth == 0 else 3 if depth == 1 else 12 * (depth - 1)
        assert int(valid.sum()) == min(nodes, candidates) if not sampled else 0 < int(valid.sum()) <= nodes
        return
    trunk = min(2, depth, nodes) if shape == "delayed" else 0
    k = min(2 if shape == "delayed" else 3, nodes - trunk)
    length = min(depth - trunk, (nodes - trunk) // max(k, 1), 2 if shape == "delayed" else depth)
    fan = sorted(len(c) for c in children.values())
    if not (sampled and shape == "without_replacement"):  # which may run out of tokens under top-p
        assert int(valid.sum()) == trunk + k * length
    assert max(fan) <= max(k, 1) and all(f == 1 for f in fan[:-1]), "one branch node, single children elsewhere"
    assert all(p == trunk - 1 for p, c in children.items() if len(c) > 1), "the branch node ends the trunk"


@pytest.fixture(scope="module")
def greedy_reference(target, ragged_prompts):
    return dk.generate(target, ragged_prompts, max_new_tokens=MAX_NEW, eos_token_id=()).sequences


@pytest.mark.parametrize("shape", list(SHAPES))
def test_greedy_equals_plain_decoding(target, ragged_prompts, greedy_reference, shape):
    drafter = SHAPES[shape](perturbed(target, 0.2, seed=1))
    out = dk.generate(
        target, ragged_prompts, drafter, GreedyVerifier(), FixedLength(8, depth=4), max_new_tokens=MAX_NEW,
        eos_token_id=(),
    )  # fmt: skip
    assert out.sequences == greedy_reference
    assert sum(out.stats.acceptance_histogram[1:]) > 0 and out.stats.accepted < out.stats.drafted


@pytest.mark.parametrize("shape", list(SHAPES))
def test_the_target_as_draft_model_is_accepted(target, ragged_prompts, greedy_reference, shape):
    """The draft cache (tree forwards, the accepted path kept across rounds) is exact: with the target as draft
    model every rollout shape's argmax path is accepted to full depth (dynamic: at least its best root child)."""
    out = dk.generate(
        target, ragged_prompts, SHAPES[shape](target), GreedyVerifier(), FixedLength(8, depth=4),
        max_new_tokens=MAX_NEW, eos_token_id=(),
    )  # fmt: skip
    assert out.sequences == greedy_reference
    hist = out.stats.acceptance_histogram
    assert hist[0] == 0
    if shape != "dynamic":
        # delayed: trunk 2 + branches of 2; iid: 3 rollouts of 8 // 3; template: its rank-0 spine
        depth = {"delayed": 4, "template": TEMPLATE.max_depth}.get(shape, 2)
        assert hist[depth] >= sum(hist) - 2 * len(ragged_prompts)  # all but the budget-capped last rounds


def test_sampled_drafts_under_greedy_verification(target, ragged_prompts, greedy_reference):
    drafter = ModelTreeDrafter(perturbed(target, 0.2, seed=1), branches=2, temperature=1.0)
    out = dk.generate(
        target, ragged_prompts, drafter, GreedyVerifier(), FixedLength(6, depth=3), max_new_tokens=MAX_NEW,
        eos_token_id=(), seed=3,
    )  # fmt: skip
    assert out.sequences == greedy_reference and out.stats.accepted > 0


@pytest.fixture(scope="module")
def lossless_models():
    target = tiny_llama(0, vocab=VOCAB, hidden=32, init=0.3)
    return target, perturbed(target, 0.3, seed=5)


LAW_CASES = {
    "iid": (lambda m: ModelTreeDrafter(m, branches=2), TraversalVerifier, "T1"),
    "without_replacement": (
        lambda m: ModelTreeDrafter(m, shape="without_replacement", branches=2),
        SpecInferVerifier,
        "T0.7-p0.9",
    ),
    "dynamic": (lambda m: ModelTreeDrafter(m, shape="dynamic", top_k=2), TraversalVerifier, "T1-k3"),
    "delayed": (lambda m: DelayedTreeDrafter(m, branches=2, trunk=1), TraversalVerifier, "T1"),
    "template": (lambda m: ModelTreeDrafter(m, shape="template", template=TEMPLATE), SpecInferVerifier, "T0.7-p0.9"),
}


@pytest.mark.parametrize("case", list(LAW_CASES))
def test_tree_drafts_keep_the_target_law(lossless_models, case):
    """4 new tokens: the first round drafts at most 2 deep (budget capped), and decides tokens 2 and 3 after the
    prefill's token 1 (the 3 tokens histogrammed); delayed: a trunk token, then 2 i.i.d. branches."""
    target, draft_model = lossless_models
    make, verifier, setting = LAW_CASES[case]
    drafter = make(draft_model)
    prompts = [p for p in PROMPTS for _ in range(ROWS_PER_PROMPT)]
    out = dk.generate(
        target, prompts, drafter, verifier(), FixedLength(4, depth=2), max_new_tokens=4, eos_token_id=(), seed=21,
        **SETTINGS[setting],
    )  # fmt: skip
    seqs = torch.tensor(out.sequences)[:, :3].reshape(len(PROMPTS), ROWS_PER_PROMPT, 3)
    codes = seqs[..., 0] * VOCAB**2 + seqs[..., 1] * VOCAB + seqs[..., 2]
    assert_matches(target, [torch.bincount(code, minlength=VOCAB**3) for code in codes], setting)
    assert out.stats.acceptance_histogram[2] > 0  # whole depth-2 paths were accepted


def test_a_row_does_not_depend_on_its_batch(lossless_models):
    target, draft_model = lossless_models
    prompts, seeds = [[1, 2, 3], [4, 5], [6, 7, 1, 2, 3, 4]], [3, 14, 15]
    drafter = DelayedTreeDrafter(draft_model, branches=3, trunk=1)

    def run(rows):
        return dk.generate(
            target, [prompts[r] for r in rows], drafter, TraversalVerifier(), FixedLength(7, depth=3),
            max_new_tokens=8, eos_token_id=(), seed=[seeds[r] for r in rows], temperature=1.0,
        ).sequences  # fmt: skip

    batch = run([0, 1, 2])
    assert [run([r])[0] for r in range(3)] == batch and run([2, 1, 0])[::-1] == batch


def test_bad_arguments_are_refused(target):
    with pytest.raises(ConfigError, match="shape must be one of"):
        ModelTreeDrafter(target, shape="beam")
    with pytest.raises(ConfigError, match="top_k is for shape='dynamic'"):
        ModelTreeDrafter(target, shape="iid", top_k=3)
    with pytest.raises(ConfigError, match="branches"):
        ModelTreeDrafter(target, branches=0)
    with pytest.raises(ConfigError, match="template is for shape='template'"):
        ModelTreeDrafter(target, template="chain4")
    with pytest.raises(ConfigError, match="unknown tree template 'medusa'; named ones: chain4"):
        ModelTreeDrafter(target, shape="template", template="medusa")
    with pytest.raises(ConfigError, match="trunk"):
        DelayedTreeDrafter(target, trunk=-1)


class StopRule:
    """A chain policy with a per-step stop rule."""

    def plan(self, state):
        return dk.DraftBudget(torch.full_like(state.lengths, 4), stop=lambda step: step.token_probs < 0.5)


def test_a_stop_rule_does_not_apply_to_trees_and_says_so_once(target, ragged_prompts):
    """Trees are drafted level by level: the stop rule is left out (the lengths bound the drafts, as for a model-free
    drafter), with one warning; it was refused in the middle of the call, after tokens were streamed."""
    plain = dk.generate(target, ragged_prompts, max_new_tokens=12, eos_token_id=()).sequences
    drafter = ModelTreeDrafter(target)
    with pytest.warns(
        UserWarning, match="ModelTreeDrafter drafts trees level by level: the policy's per-step stop"
    ) as w:
        out = dk.generate(target, ragged_prompts, drafter, policy=StopRule(), max_new_tokens=12, eos_token_id=())
    assert out.sequences == plain and out.stats.drafted > 0
    assert sum("level by level" in str(r.message) for r in w) == 1


class SyncCounter(Recorder):
    """Counts the host syncs inside the wrapped drafter's ``propose`` and ``observe``, and how often rows left the
    batch (the draft cache then reads its lengths once, as :class:`ModelDrafter`'s does)."""

    syncs = leaves = 0

    def select_rows(self, rows):
        self.leaves += 1
        self.inner.select_rows(rows)

    def propose(self, state, budget):
        with count_syncs() as counter:
            draft = self.inner.propose(state, budget)
        self.syncs += counter[0]
        return draft

    def observe(self, state, round):
        with count_syncs() as counter:
            self.inner.observe(state, round)
        self.syncs += counter[0]


@pytest.mark.parametrize(
    ("shape", "temperature"),
    [("iid", 1.0), ("without_replacement", 1.0), ("dynamic", 0.0), ("delayed", 0.0), ("template", 1.0)],
)
def test_no_host_syncs_of_its_own(target, ragged_prompts, shape, temperature):
    drafter = SyncCounter(SHAPES[shape](perturbed(target, 0.2, seed=1)))
    out = dk.generate(
        target, ragged_prompts, drafter, TraversalVerifier(), FixedLength(8, depth=4), max_new_tokens=12,
        eos_token_id=(), temperature=temperature, seed=0,
    )  # fmt: skip
    assert out.stats.rounds > 3 and drafter.syncs <= drafter.leaves  # the last leave ends the call


def test_per_position_counts_follow_depth_for_trees(target, ragged_prompts):
    """A position is a depth: a 7-node template of depth 3 drafts positions 1..3 (node counts once gave 7 positions,
    the deeper ones understated and the last four always 0)."""
    drafter = ModelTreeDrafter(target, shape="template", template=TEMPLATE)
    out = dk.generate(target, ragged_prompts, drafter, policy=dk.policies.FixedLength(7, depth=3), max_new_tokens=12)
    stats = out.stats
    assert len(stats.drafted_per_pos) == 3 and stats.drafted_per_pos[0] == stats.num_drafts
    assert stats.drafted > sum(stats.drafted_per_pos)  # every node counted in drafted, one per depth per position
    assert stats.acceptance_rate_per_pos[2] > 0  # the target drafting for itself: deep paths accepted
