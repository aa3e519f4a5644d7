"""SWIFT-style layer skipping: the model's skip_layers forward, greedy output equal to plain decoding, the exact
output law under rejection sampling, and the search finding the layers that do nothing."""

from __future__ import annotations

import random

import pytest
import torch

import decodekit as dk
from decodekit.drafters import layer_skip
from decodekit.drafters.layer_skip import LayerSkipDrafter, bayes_candidate
from decodekit.errors import ConfigError
from decodekit.masks import chain_mask
from decodekit.models.tiny import tiny_llama
from decodekit.policies import FixedLength
from decodekit.verifiers import RejectionVerifier
from tests.conftest import assert_greedy_twice
from tests.unit.test_lossless import assert_matches, sample_counts


def idle(model, layers):
    """``model`` with the given 1-based layers adding nothing to the residual stream."""
    with torch.no_grad():
        for i in layers:
            model.model.layers[i - 1].self_attn.o_proj.weight.zero_()
            model.model.layers[i - 1].mlp.down_proj.weight.zero_()
    return model


@pytest.fixture(scope="module")
def deep():
    return dk.load_model(tiny_llama(3, layers=6))


def forward(lm, tokens, **kwargs):
    cache = lm.new_cache(1, 16)
    view = cache.stage(tokens.shape[1])
    mask, positions = chain_mask(cache.lengths, tokens.shape[1], view.kv_len)
    return lm.forward(tokens, positions, mask, view, **kwargs), cache


def test_skipping_idle_layers_changes_nothing_and_writes_no_kv():
    lm = dk.load_model(idle(tiny_llama(2, layers=4), [2, 3]))
    tokens = torch.tensor([[5, 9, 2, 7]])
    full, _ = forward(lm, tokens)
    skipped, cache = forward(lm, tokens, skip_layers=(2, 3))
    torch.testing.assert_close(skipped.logits, full.logits)
    assert [cache.staged_extent(i) for i in range(4)] == [4, 0, 0, 4]
    other, _ = forward(lm, tokens, skip_layers=(1,))
    assert not torch.allclose(other.logits, full.logits)  # a layer that does something matters
    with pytest.raises(ConfigError, match="skip_layers entries"):
        forward(lm, tokens, skip_layers=(5,))


def test_greedy_equals_plain_decoding(deep, ragged_prompts):
    reference = dk.generate(deep, ragged_prompts, max_new_tokens=40, eos_token_id=()).sequences
    drafter = LayerSkipDrafter(window=6, search_rounds=8)
    assert_greedy_twice(deep, ragged_prompts, drafter, FixedLength(3), reference, 40)
    assert drafter.searched == 8 and drafter.history


def test_the_search_finds_the_idle_layers(ragged_prompts):
    """Layers 3, 4 and 5 of 8 do nothing: skipping 3 of the 6 middle layers, the best set is exactly them (then
    every draft is accepted; its score is below 1 only because early windows hold random prompt tokens)."""
    lm = dk.load_model(idle(tiny_llama(4, layers=8), [3, 4, 5]))
    drafter = LayerSkipDrafter(skip_ratio=0.5, window=8, search_rounds=60, seed=1)
    reference = dk.generate(lm, ragged_prompts, max_new_tokens=60, eos_token_id=()).sequences
    out = dk.generate(lm, ragged_prompts, drafter, policy=FixedLength(4), max_new_tokens=60, eos_token_id=())
    assert out.sequences == reference
    assert drafter.history[0][1] == (2, 4, 6)  # every other layer first
    assert drafter.skip == (3, 4, 5) and drafter.score > 0.9
    again = dk.generate(lm, ragged_prompts, drafter, policy=FixedLength(4), max_new_tokens=30, eos_token_id=())
    assert again.stats.draft_acceptance_rate == 1.0  # the set is kept for the next call


def test_sampling_is_lossless():
    lm = dk.load_model(tiny_llama(0, vocab=8, hidden=32, layers=4, init=0.3))
    drafter = LayerSkipDrafter(window=2, search_rounds=4)
    counts, stats = sample_counts(lm, drafter, RejectionVerifier(), FixedLength(2), "T1", seed=51)
    assert_matches(lm.hf, counts, "T1")
    assert 0.05 < stats.draft_acceptance_rate < 1.0


def test_bad_settings(deep):
    with pytest.raises(ConfigError, match="skip_ratio"):
        LayerSkipDrafter(skip_ratio=1.0)
    with pytest.raises(ConfigError, match="window"):
        LayerSkipDrafter(window=1)


def test_bayes_step_proposes_sets_near_the_best_scored():
    """The GP-UCB step on a known objective (the share of 4 good layers among the 4 skipped, 12 middle layers): after
    10 random sets it proposes sets with more good layers than random sets have, and it is seeded by ``rng``."""
    good = {3, 6, 9, 12}
    rng = random.Random(0)
    layers = list(range(2, 14))
    hits, random_hits = [], []
    for trial in range(8):
        scored = []
        for _ in range(10):
            skip = tuple(sorted(rng.sample(layers, 4)))
            scored.append((len(good & set(skip)) / 4 + rng.gauss(0, 0.02), skip))
        proposal = bayes_candidate(scored, 14, 4, random.Random(trial))
        assert len(proposal) == 4 and set(proposal) <= set(layers)
        hits.append(len(good & set(proposal)))
        random_hits.append(max(len(good & set(skip)) for _, skip in scored))
    assert sum(hits) / 8 >= 2.5 > 4 * 4 / 12  # random sets average 1.33 good layers
    assert sum(hits) >= sum(random_hits) - 2  # about as good as the best seen, often better
    again = bayes_candidate(scored, 14, 4, random.Random(7))
    assert again == bayes_candidate(scored, 14, 4, random.Random(7))


def test_the_search_takes_bayes_steps(deep, ragged_prompts, monkeypatch):
    drafter = LayerSkipDrafter(window=6, search_rounds=9, bayes_every=3)
    calls = []
    original = layer_skip.bayes_candidate

    def spy(scored, *args, **kwargs):
        calls.append(list(scored))
        return original(scored, *args, **kwargs)

    monkeypatch.setattr(layer_skip, "bayes_candidate", spy)
    dk.generate(deep, ragged_prompts, drafter, policy=FixedLength(3), max_new_tokens=30, eos_token_id=())
    assert len(calls) == 3 and len(drafter.scored) == 9  # steps 3, 6 and 9; every candidate recorded
    assert [len(c) for c in calls] == [2, 5, 8]
    with pytest.raises(ConfigError, match="bayes_every"):
        LayerSkipDrafter(bayes_every=0)
