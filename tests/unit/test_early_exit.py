"""The early-exit drafter (the target's first layers and its own head, in its own KV cache): greedy output equal
to plain decoding, the exact output law under rejection sampling (a drafter that misreports q fails the same test),
the exit layer checked against the target, and no host syncs of its own."""

from __future__ import annotations

import pytest

import decodekit as dk
from decodekit.drafters.early_exit import EarlyExitDrafter
from decodekit.errors import ConfigError
from decodekit.models.tiny import tiny_llama
from decodekit.policies import FixedLength
from decodekit.verifiers import RejectionVerifier
from tests.conftest import assert_greedy_twice
from tests.unit.test_lossless import MisreportsQ, assert_detected, assert_matches, sample_counts


@pytest.fixture(scope="module")
def deep():
    return dk.load_model(tiny_llama(3, layers=4))


@pytest.fixture(scope="module")
def small_vocab():
    return dk.load_model(tiny_llama(0, vocab=8, hidden=32, layers=3, init=0.3))


@pytest.mark.parametrize("exit_layer", [1, 3])
def test_greedy_equals_plain_decoding(deep, ragged_prompts, exit_layer):
    reference = dk.generate(deep, ragged_prompts, max_new_tokens=30, eos_token_id=()).sequences
    assert_greedy_twice(deep, ragged_prompts, EarlyExitDrafter(exit_layer), FixedLength(3), reference, 30)


def test_default_exit_is_half_the_layers_and_registered(deep, ragged_prompts):
    drafter = dk.build("drafter", "early_exit")
    dk.generate(deep, ragged_prompts, drafter, max_new_tokens=4)
    assert isinstance(drafter, EarlyExitDrafter) and drafter.layers == 2


@pytest.mark.parametrize("setting", ["T1", "T0.7-p0.9"])
def test_sampling_is_lossless(small_vocab, setting):
    counts, stats = sample_counts(small_vocab, EarlyExitDrafter(1), RejectionVerifier(), FixedLength(2), setting, 31)
    assert_matches(small_vocab.hf, counts, setting)
    assert 0.05 < stats.draft_acceptance_rate < 0.95


def test_a_drafter_that_misreports_q_is_detected(small_vocab):
    drafter = MisreportsQ(EarlyExitDrafter(1))
    counts, _ = sample_counts(small_vocab, drafter, RejectionVerifier(), FixedLength(2), "T1", seed=32)
    assert_detected(small_vocab.hf, counts, "T1")


def test_exit_layer_must_leave_layers_to_skip(deep, ragged_prompts):
    with pytest.raises(ConfigError, match=r"below the target's 4 layers.*pick 1\.\.3"):
        dk.generate(deep, ragged_prompts, EarlyExitDrafter(4), max_new_tokens=4)
    with pytest.raises(ConfigError, match="exit_layer"):
        EarlyExitDrafter(0)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_no_host_syncs_of_its_own(deep, temperature):
    from tests.unit.test_host_syncs import syncs_per_round

    assert syncs_per_round(deep, EarlyExitDrafter(2), FixedLength(3), temperature) <= 2
