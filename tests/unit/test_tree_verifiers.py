"""The tree verifiers are lossless, by exact enumeration of one verification step (``verifiers.md`` §8 T1).

Tiny vocabulary (3 tokens) and context-dependent target / draft tables. For a tree shape and a drafting process
(i.i.d. siblings, siblings without replacement, a deterministic top-k tree, a delayed tree), every possible draft is
enumerated with its probability, all of them verified in one batch through the verifier's exact plan, and the law of
the step's output (accepted path, then the next token; shorter outputs extended by the target) is computed exactly
and compared with the target's. A deliberately biased variant of each verifier must fail the same comparison, and
the lossy typical-acceptance verifier must too. Efficiency is pinned where the papers say so: Traversal equals
block verification on chains and is never below SpecInfer on trees; K-SEQ is never below SpecInfer on i.i.d.
trees.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools

import pytest
import torch

import decodekit as dk
from decodekit.verifiers import block, specinfer, spectr, traversal
from decodekit.verifiers.tree import SequencePlan, WalkPlan, draw_laws
from tests.unit.test_block import V, _after, table, target_law, tv

SAMPLED, WOR, DET = dk.DraftKind.SAMPLED, dk.DraftKind.SAMPLED_WITHOUT_REPLACEMENT, dk.DraftKind.DETERMINISTIC

SHAPES = {  # parents of each node, in draw order
    "chain-3": [-1, 0, 1],
    "2 paths x 2": [-1, -1, 0, 1],  # two rollouts from the root (i.i.d. or w/o replacement at the root)
    "3 paths x 2": [-1, -1, -1, 0, 1, 2],
    "2 paths x 3": [-1, -1, 0, 1, 2, 3],
    "branch at depth 2": [-1, -1, 0, 0, 1],  # node 0 has two children
    "delayed (2, 1, 2)": [-1, 0, 0, 1, 2],  # a trunk of 1, then 2 rollouts of 2
    "delayed (3, 1, 1)": [-1, 0, 0, 0],
    "delayed (2, 2, 1)": [-1, 0, 1, 1],
}


def top_p(f, mass: float = 0.9):
    """``f`` truncated to its nucleus (the smallest set of tokens with probability >= ``mass``), renormalised."""

    @functools.cache  # the enumerations ask for the same prefixes many times; callers do not change rows in place
    def g(prefix):
        probs = f(prefix)
        values, index = probs.sort(descending=True)
        keep = values.cumsum(0) - values < mass
        out = torch.zeros_like(probs).scatter(0, index, values * keep)
        return out / out.sum()

    return g


SETTINGS = {
    "T1": lambda: (table(1), table(2)),
    "T0.7-p0.9": lambda: (top_p(table(1, 0.7)), top_p(table(2, 0.7))),
    "p = q": lambda: (table(5), table(5)),
}


def paths(parents: list[int], tokens: tuple[int, ...]) -> list[tuple[int, ...]]:
    out: list[tuple[int, ...]] = []
    for i, parent in enumerate(parents):
        out.append((*(out[parent] if parent >= 0 else ()), tokens[i]))
    return out


def drafts(parents: list[int], kind: dk.DraftKind, q) -> list[tuple[tuple[int, ...], float]]:
    """Every draft of the tree shape under the drafting process, with its probability."""
    n = len(parents)
    if kind is DET:  # children of each node: its parent's most likely tokens, in order of probability
        tokens: list[int] = []
        for i, parent in enumerate(parents):
            prefix = paths(parents[:i], tuple(tokens))[parent] if parent >= 0 else ()
            rank = sum(1 for j in range(i) if parents[j] == parent)
            tokens.append(int(q(prefix).argsort(descending=True)[rank]))
        return [(tuple(tokens), 1.0)]
    out = []
    for tokens in itertools.product(range(V), repeat=n):
        mass = 1.0
        for i, (parent, path) in enumerate(zip(parents, paths(parents, tokens))):
            law = q(path[:-1]).clone()
            if kind is WOR:
                for j in range(i):
                    if parents[j] == parent:
                        law[tokens[j]] = 0
                law = law / law.sum() if law.sum() > 0 else law
            mass *= float(law[tokens[i]])
        if mass > 0:
            out.append((tokens, mass))
    return out


def batch(parents: list[int], kind: dk.DraftKind, p, q):
    """All drafts as one batch: the Draft, the target rows ``[R, N + 1, V]`` and the probabilities ``[R]``."""
    outcomes = drafts(parents, kind, q)
    tokens = torch.tensor([t for t, _ in outcomes])
    rows = len(outcomes)
    prefixes = [[(), *paths(parents, t)] for t, _ in outcomes]  # row 0: the root
    target = torch.stack([torch.stack([p(x) for x in pre]) for pre in prefixes])
    fields = {"kind": kind}
    if kind is not DET:
        fields["q"] = torch.stack([torch.stack([q(x[:-1]) for x in pre[1:]]) for pre in prefixes])
    parent_t = torch.tensor(parents).expand(rows, -1)
    draft = dk.Draft.tree(tokens, parent_t, torch.ones_like(tokens, dtype=torch.bool), **fields)
    return draft, target, torch.tensor([m for _, m in outcomes], dtype=torch.float64), prefixes


def emitter(p, length: int, law: dict):
    """``emit(path, probs, mass)``: adds to ``law`` the outputs ``path + y`` (``y ~ probs``) extended by the target
    ``p`` to ``length`` tokens."""

    def emit(path, probs, mass):
        for y, py in enumerate(probs.tolist()):
            if py > 0:
                prefix = (*path, y)
                if len(prefix) == length:
                    law[prefix] = law.get(prefix, 0.0) + mass * py
                else:
                    emit(prefix, p(prefix), mass * py)

    return emit


def output_law(parents, kind, p, q, plan_fn) -> tuple[dict, float]:
    """Exact law of the first ``depth + 1`` output tokens of one step, and the expected accepted length."""
    draft, target, masses, prefixes = batch(parents, kind, p, q)
    plan = plan_fn(draft, target, draw_laws(draft, target))
    law: dict[tuple[int, ...], float] = {}
    emit = emitter(p, max(len(x) for x in prefixes[0]) + 1, law)
    expected = 0.0

    for r, mass in enumerate(masses.tolist()):
        if isinstance(plan, WalkPlan):
            stack = [(-1, mass)]  # (node, probability of reaching it)
            while stack:
                node, reach = stack.pop()
                stay = reach
                for c in (i for i, parent in enumerate(parents) if parent == node):
                    a = float(plan.accept[r, c])
                    stack.append((c, stay * a))
                    stay *= 1 - a
                path = prefixes[r][node + 1]
                expected += stay * len(path)
                emit(path, plan.residual[r, node + 1], stay)
        else:
            assert isinstance(plan, SequencePlan)
            left = mass
            for j in range(len(parents) + 1):
                node, a = int(plan.order[r, j]), float(plan.alpha[r, j])
                path = prefixes[r][node + 1]
                expected += left * a * len(path)
                emit(path, plan.emission[r, j], left * a)
                left *= 1 - a
            assert left < 1e-12  # the root's visit always accepts
    return law, expected


PLANS = {"specinfer": specinfer.rrs_plan, "traversal": traversal.traversal_plan, "spectr": spectr.kseq_plan}
CASES = [
    *[(v, s, k) for v in PLANS for s in SHAPES for k in (SAMPLED, DET)],
    *[(v, s, WOR) for v in ("specinfer", "traversal") for s in ("2 paths x 2", "3 paths x 2", "branch at depth 2")],
]


@pytest.mark.parametrize("setting", SETTINGS)
@pytest.mark.parametrize(("verifier", "shape", "kind"), CASES, ids=lambda x: getattr(x, "value", x))
def test_one_tree_step_is_exactly_the_target(verifier, shape, kind, setting):
    p, q = SETTINGS[setting]()
    if sum(mass for _, mass in drafts(SHAPES[shape], kind, q)) < 1 - 1e-9:
        pytest.skip("some nucleus holds fewer tokens than the siblings drawn from it without replacement")
    plan = spectr.spectr_plan if verifier == "spectr" else PLANS[verifier]
    law, _ = output_law(SHAPES[shape], kind, p, q, plan)
    length = len(next(iter(law)))
    assert tv(law, target_law(p, length)) < 1e-9


# ------------------------------------------------------------------------------------------ negative controls
def rrs_ignoring_removal(draft, target, laws):
    """RRS with the parent's q for siblings drawn without replacement (the with-replacement rule on a w/o tree)."""
    return specinfer.rrs_plan(draft, target, draw_laws(dataclasses.replace(draft, kind=SAMPLED), target))


def traversal_ignoring_removal(draft, target, laws):
    return traversal.traversal_plan(draft, target, draw_laws(dataclasses.replace(draft, kind=SAMPLED), target))


def kseq_rounded_down(draft, target, laws):
    """K-SEQ with ρ = 1 (no relaxation) for every parent: the residual goes negative and is clamped."""
    original = spectr.kseq_rho
    spectr.kseq_rho = lambda p, q, k, steps=0: torch.ones_like(k, dtype=torch.float64)
    try:
        return spectr.kseq_plan(draft, target, laws)
    finally:
        spectr.kseq_rho = original


@pytest.mark.parametrize(
    ("plan", "shape", "kind"),
    [
        (rrs_ignoring_removal, "3 paths x 2", WOR),
        (traversal_ignoring_removal, "3 paths x 2", WOR),
        (kseq_rounded_down, "3 paths x 2", SAMPLED),
    ],
    ids=["specinfer without q-removal", "traversal without q-removal", "spectr with rho = 1"],
)
def test_biased_variants_are_detected(plan, shape, kind):
    p, q = SETTINGS["T1"]()
    law, _ = output_law(SHAPES[shape], kind, p, q, plan)
    assert tv(law, target_law(p, len(next(iter(law))))) > 1e-3


def test_typical_acceptance_is_detected_as_lossy():
    """The lossy verifier, run through the same exact comparison (its next token comes from the target at the
    deepest accepted node, with no residual)."""
    verifier = dk.build("verifier", "typical", posterior_threshold=0.3, posterior_alpha=0.6)
    assert not verifier.lossless
    p, q = SETTINGS["T1"]()
    parents = SHAPES["2 paths x 2"]
    draft, target, masses, prefixes = batch(parents, SAMPLED, p, q)
    law: dict = {}
    emit = emitter(p, 3, law)
    logits = target.log()
    for r, mass in enumerate(masses.tolist()):
        one = dk.Draft.tree(
            draft.tokens[r : r + 1],
            draft.parents[r : r + 1],
            draft.valid[r : r + 1],
            kind=SAMPLED,
            q=draft.q[r : r + 1],
        )
        verdict = verifier.verify(one, logits[r : r + 1], dk.SamplingParams(1.0), None)  # the path is deterministic
        num = int(verdict.num_accepted[0])
        node = int(verdict.accepted[0, num - 1]) if num else -1
        emit(prefixes[r][node + 1], target[r, node + 1], mass)
    assert tv(law, target_law(p, 3)) > 1e-3


# ------------------------------------------------------------------------------------------------ efficiency
@pytest.mark.parametrize("setting", ["T1", "T0.7-p0.9"])
def test_traversal_is_block_verification_on_a_chain(setting):
    """On a chain, Traversal accepts exactly as many tokens in expectation as block verification (and more than
    token-wise rejection, which SpecInfer is on a chain)."""
    p, q = SETTINGS[setting]()
    _, traversal_len = output_law(SHAPES["chain-3"], SAMPLED, p, q, traversal.traversal_plan)
    _, rrs_len = output_law(SHAPES["chain-3"], SAMPLED, p, q, specinfer.rrs_plan)
    block_len = 0.0
    for tokens, mass in drafts(SHAPES["chain-3"], SAMPLED, q):
        qs = torch.stack([q(tokens[:i]) for i in range(3)])
        ps = torch.stack([p(tokens[:i]) for i in range(4)])
        h, _ = block.block_plan(ps[None], qs[None], torch.tensor([tokens]), torch.tensor([3]))
        h = h[0].tolist()
        block_len += mass * sum(i * h[i] * _after(h, i) for i in range(1, 4))
    assert traversal_len == pytest.approx(block_len, abs=1e-12)
    assert traversal_len > rrs_len


@pytest.mark.parametrize("shape", ["2 paths x 2", "3 paths x 2", "delayed (2, 1, 2)", "branch at depth 2"])
def test_the_papers_ordering_on_iid_trees(shape):
    """Expected accepted tokens: Traversal >= SpecInfer and K-SEQ >= SpecInfer on i.i.d. trees (the orderings the
    Traversal and SpecTr papers prove); exact, so no tolerance beyond rounding."""
    p, q = SETTINGS["T1"]()
    lengths = {name: output_law(SHAPES[shape], SAMPLED, p, q, plan)[1] for name, plan in PLANS.items()}
    assert lengths["traversal"] >= lengths["specinfer"] - 1e-12
    assert lengths["spectr"] >= lengths["specinfer"] - 1e-12
