"""The tree verifiers are lossless in the whole loop: the joint law of the first 3 generated tokens, sampled with
tree drafts from the draft model (i.i.d. rollouts, siblings without replacement, a deterministic dynamic tree, a
delayed tree), equals the target's (chi-square and total variation, ``tests/unit/test_lossless.py``'s test).
Typical acceptance (lossy) and a drafter that mislabels its siblings' drafting process must fail the same test.
The one-step laws are checked exactly in ``tests/unit/test_tree_verifiers.py``."""

from __future__ import annotations

import dataclasses

import pytest

import decodekit as dk
from decodekit.drafters import DelayedTreeDrafter, ModelTreeDrafter
from decodekit.policies import FixedLength
from decodekit.verifiers import SpecInferVerifier, SpecTrVerifier, TraversalVerifier, TypicalAcceptanceVerifier
from tests.unit.spies import Wrapped
from tests.unit.test_lossless import assert_detected, assert_matches, models, sample_counts  # noqa: F401

VERIFIERS = {"specinfer": SpecInferVerifier, "spectr": SpecTrVerifier, "traversal": TraversalVerifier}
DRAFTERS = {
    "iid": lambda draft: ModelTreeDrafter(draft, shape="iid", branches=2),
    "without_replacement": lambda draft: ModelTreeDrafter(draft, shape="without_replacement", branches=2),
    "dynamic": lambda draft: ModelTreeDrafter(draft, shape="dynamic", top_k=2),
    "delayed": lambda draft: DelayedTreeDrafter(draft, branches=2, trunk=1, branch_length=1),
}
POLICY = FixedLength(4, depth=2)  # 2 rollouts of 2, a delayed tree (2, 1, 1), a dynamic tree of 4 nodes


@pytest.mark.parametrize(
    ("verifier", "drafter", "setting"),
    [
        ("traversal", "iid", "T1"),
        ("traversal", "without_replacement", "T1"),
        ("traversal", "dynamic", "T0.7-p0.9"),
        ("traversal", "delayed", "T1"),
        ("specinfer", "iid", "T0.7-p0.9"),
        ("specinfer", "without_replacement", "T0.7-p0.9"),
        ("spectr", "iid", "T1"),
        ("spectr", "delayed", "T0.7-p0.9"),
    ],  # every verifier x kind x setting is enumerated exactly in test_tree_verifiers.py; these run the loop
)
def test_tree_verification_in_the_loop_is_lossless(models, verifier, drafter, setting):  # noqa: F811
    target, draft = models
    counts, stats = sample_counts(target, DRAFTERS[drafter](draft), VERIFIERS[verifier](), POLICY, setting, seed=41)
    assert_matches(target, counts, setting)
    assert stats.accepted > 0  # drafts were accepted, so the tree path was exercised
    assert stats.acceptance_rate_per_pos[1] > 0  # depth-2 nodes were drafted and accepted, not siblings only


def test_typical_acceptance_is_detected_as_lossy(models):  # noqa: F811
    target, draft = models
    verifier = TypicalAcceptanceVerifier(posterior_threshold=0.3, posterior_alpha=0.6)
    counts, _ = sample_counts(target, DRAFTERS["iid"](draft), verifier, POLICY, "T1", seed=42)
    assert_detected(target, counts, "T1")


class ClaimsIID(Wrapped):
    """Biased on purpose: siblings drawn without replacement, declared i.i.d. (the verifier then keeps the
    rejected siblings in ``q``)."""

    def draft_kind(self, sampling):
        return dk.DraftKind.SAMPLED

    def propose(self, state, budget):
        return dataclasses.replace(self.inner.propose(state, budget), kind=dk.DraftKind.SAMPLED)


def test_a_mislabelled_drafting_process_is_detected(models):  # noqa: F811
    target, draft = models
    drafter = ClaimsIID(ModelTreeDrafter(draft, shape="without_replacement", branches=3, temperature=1.5))
    counts, _ = sample_counts(target, drafter, SpecInferVerifier(), FixedLength(3, depth=1), "T1", seed=43)
    assert_detected(target, counts, "T1")


def test_tree_drafts_default_to_traversal_when_sampling(models, ragged_prompts):  # noqa: F811
    """With no verifier given, rejection sampling verifies chains and traversal verification trees (rejection
    sampling refuses trees); the output is the same as with TraversalVerifier passed explicitly."""
    target, draft = models
    prompts = [[t % 8 for t in p] for p in ragged_prompts]

    def run(verifier):
        drafter = ModelTreeDrafter(draft, shape="iid", branches=2)
        out = dk.generate(target, prompts, drafter, verifier, POLICY, max_new_tokens=12, temperature=1.0, seed=5)
        return out.sequences, out.stats.accepted

    (default, accepted), (explicit, _) = run(None), run(TraversalVerifier())
    assert default == explicit and accepted > 0
    with pytest.raises(dk.IncompatibleDraftError, match="chains only"):
        run(dk.verifiers.RejectionVerifier())


@pytest.mark.parametrize("name", ["suffix", "recycling"])
def test_model_free_tree_drafters_sample_with_the_default_verifiers(target, ragged_prompts, name):
    """At temperature > 0 generate() verifies tree rounds with its tree verifier, chain and empty rounds with
    rejection sampling; seeded runs repeat."""

    def run():
        drafter = dk.build("drafter", name)
        return dk.generate(
            target,
            ragged_prompts,
            drafter,
            policy=FixedLength(12, depth=4),
            max_new_tokens=20,
            temperature=0.8,
            seed=3,
            eos_token_id=(),
        )

    first, second = run(), run()
    assert first.sequences == second.sequences and first.stats.drafted > 0
