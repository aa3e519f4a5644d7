"""Bad input fails early, before any model compute, with an error that says what to change."""

from __future__ import annotations

import pytest
import torch

import decodekit as dk
from decodekit.drafters import ModelDrafter, NGramDrafter
from decodekit.models.tiny import tiny_llama
from decodekit.verifiers import GreedyVerifier, RejectionVerifier


class NeverCalled:
    """A drafter that fails the test if generate() ever reaches it."""

    vocab_size = 128

    def propose(self, state, budget):
        raise AssertionError("generate() ran although its input was invalid")


def test_draft_vocabulary_mismatch(target):
    with pytest.raises(dk.VocabMismatchError, match="has 64 output rows but the target has 128, and neither carries"):
        dk.generate(target, [[1, 2]], drafter=ModelDrafter(tiny_llama(1, vocab=64)))


@pytest.mark.parametrize("prompts", [[], [[]], [[1, 2], []], torch.zeros(2, 0, dtype=torch.long)])
def test_empty_prompt(target, prompts):
    with pytest.raises(dk.EmptyPromptError):
        dk.generate(target, prompts, drafter=NeverCalled())


def test_prompt_longer_than_context(target):
    with pytest.raises(dk.ContextLengthError, match="at most 255 tokens"):
        dk.generate(target, [[1] * 256], drafter=NeverCalled())


def test_generation_stops_at_the_context(target):
    with pytest.warns(UserWarning, match="context"):
        out = dk.generate(target, [[1] * 250], max_new_tokens=20, eos_token_id=())
    assert len(out.sequences[0]) == 6 and out.finish_reasons == ["length"]


def test_prompt_ids_outside_vocabulary(target):
    with pytest.raises(dk.ConfigError, match="outside the vocabulary"):
        dk.generate(target, [[1, 128]])


def test_unknown_component_name():
    with pytest.raises(dk.UnknownComponentError, match=r"available: (\w+, )*model, (\w+, )*ngram"):
        dk.build("drafter", "eagle-9000")
    with pytest.raises(dk.UnknownComponentError, match="unknown component kind"):
        dk.build("sampler", "ngram")


class SampledOnlyVerifier(RejectionVerifier):
    accepts = frozenset({dk.DraftKind.SAMPLED})


def test_verifier_that_cannot_take_the_draft_kind(target):
    with pytest.raises(dk.IncompatibleDraftError, match="cannot verify deterministic drafts from NGramDrafter"):
        dk.generate(target, [[1, 2]], NGramDrafter(), SampledOnlyVerifier(), temperature=1.0)
    with pytest.raises(dk.IncompatibleDraftError, match="deterministic"):  # argmax drafting under sampling
        dk.generate(target, [[1, 2]], ModelDrafter(target, temperature=0.0), SampledOnlyVerifier(), temperature=1.0)


class TreeDrafter:
    def propose(self, state, budget):
        b = state.batch_size
        return dk.Draft(
            tokens=torch.ones(b, 2, dtype=torch.long),
            parents=torch.full((b, 2), -1),
            valid=torch.ones(b, 2, dtype=torch.bool),
        )


def test_chain_verifier_refuses_tree_drafts(target):
    with pytest.raises(dk.IncompatibleDraftError, match="chains only"):
        dk.generate(target, [[1, 2]], TreeDrafter(), RejectionVerifier(), temperature=1.0)


def test_greedy_verifier_refuses_sampling(target):
    with pytest.raises(dk.ConfigError, match="temperature=0.8"):
        dk.generate(target, [[1, 2]], NeverCalled(), GreedyVerifier(), temperature=0.8)


@pytest.mark.parametrize(
    ("tokens", "parents", "message"),
    [
        ([[5, 6]], [[-1, 1]], "parents"),  # a node is its own parent
        ([[5, 999]], [[-1, 0]], "vocabulary"),
        ([[5, 6, 7, 8, 9]], [[-1, 0, 1, 2, 3]], "budget"),  # more nodes than FixedLength(4) allows
    ],
)
def test_malformed_custom_drafts(target, tokens, parents, message):
    class Bad:
        def propose(self, state, budget):
            return dk.Draft(
                tokens=torch.tensor(tokens),
                parents=torch.tensor(parents),
                valid=torch.ones(1, len(tokens[0]), dtype=torch.bool),
            )

    with pytest.raises(dk.ConfigError, match=message):
        dk.generate(target, [[1, 2]], Bad(), max_new_tokens=10)


def test_sampled_draft_needs_q():
    with pytest.raises(dk.IncompatibleDraftError, match="needs q"):
        dk.Draft.chain(torch.ones(1, 2, dtype=torch.long), kind=dk.DraftKind.SAMPLED)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(temperature=-1.0), "temperature"),
        (dict(temperature=1.0, top_p=0.0), "top_p"),
        (dict(temperature=1.0, top_k=-3), "top_k"),
        (dict(max_new_tokens=0), "max_new_tokens"),
    ],
)
def test_bad_sampling_arguments(target, kwargs, message):
    with pytest.raises(dk.ConfigError, match=message):
        dk.generate(target, [[1, 2]], NeverCalled(), **kwargs)


def test_objects_that_are_not_components(target):
    with pytest.raises(dk.ConfigError, match="Drafter protocol"):
        dk.generate(target, [[1, 2]], drafter=object())
    with pytest.raises(dk.ConfigError, match="min_ngram"):
        NGramDrafter(max_ngram=1, min_ngram=2)
    with pytest.raises(dk.ConfigError):
        dk.policies.FixedLength(-1)


def test_errors_are_value_errors():
    assert issubclass(dk.ContextLengthError, ValueError) and issubclass(dk.ContextLengthError, dk.DecodeKitError)
