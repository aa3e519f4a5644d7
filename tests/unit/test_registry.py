"""The registry resolves names to the same classes the package exports."""

from __future__ import annotations

import pytest

import decodekit as dk


@pytest.mark.parametrize(
    ("kind", "name", "cls"),
    [
        ("drafter", "ngram", dk.drafters.NGramDrafter),
        ("drafter", "model", dk.drafters.ModelDrafter),
        ("verifier", "greedy", dk.verifiers.GreedyVerifier),
        ("verifier", "rejection", dk.verifiers.RejectionVerifier),
        ("policy", "fixed", dk.policies.FixedLength),
        ("policy", "heuristic", dk.policies.HeuristicLength),
        ("policy", "confidence", dk.policies.ConfidenceStop),
    ],
)
def test_names_resolve_to_classes(kind, name, cls):
    assert dk.registry.resolve(kind, name) is cls


def test_build_passes_arguments():
    drafter = dk.build("drafter", "ngram", max_ngram=5)
    assert isinstance(drafter, dk.drafters.NGramDrafter) and drafter.max_ngram == 5
    assert isinstance(drafter, dk.Drafter)


def test_register_a_user_component():
    @dk.register("policy", "always-two")
    class AlwaysTwo(dk.policies.FixedLength):
        def __init__(self):
            super().__init__(2)

    assert dk.build("policy", "always-two").k == 2
    with pytest.raises(ValueError, match="already taken"):
        dk.register("policy", "always-two")(dk.policies.FixedLength)
