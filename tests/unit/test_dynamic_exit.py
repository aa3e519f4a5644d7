"""DEL's dynamic exit: greedy output equal to plain decoding, the exact output law under rejection sampling, the
choice of exit layer and length from shadow-token acceptance (a target whose last layers do nothing is drafted
from the shallowest exact layer, every draft accepted), its objective, and its refusals."""

from __future__ import annotations

import pytest
import torch

import decodekit as dk
from decodekit.drafters.dynamic_exit import DynamicExitDrafter, tokens_per_layer
from decodekit.errors import ConfigError
from decodekit.models.tiny import tiny_llama
from decodekit.policies import FixedLength
from decodekit.verifiers import RejectionVerifier
from tests.unit.test_lossless import assert_matches, sample_counts


@pytest.fixture(scope="module")
def deep():
    return dk.load_model(tiny_llama(3, layers=4))


@pytest.fixture(scope="module")
def idle_top():
    """A 4-layer target whose layers 3 and 4 add nothing to the residual stream: exiting after layer 2 is exact."""
    model = tiny_llama(4, layers=4)
    with torch.no_grad():
        for layer in model.model.layers[2:]:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
    return dk.load_model(model)


def test_greedy_equals_plain_decoding(deep, ragged_prompts):
    reference = dk.generate(deep, ragged_prompts, max_new_tokens=40, eos_token_id=()).sequences
    for every in (1, 3):
        drafter = DynamicExitDrafter([1, 2, 3], probes=None, every=every)
        out = dk.generate(
            deep, ragged_prompts, drafter, policy=FixedLength(4), max_new_tokens=40, eos_token_id=(), debug=True
        )
        assert out.sequences == reference and drafter.history


def test_picks_the_shallowest_exact_layer_and_the_longest_draft(idle_top, ragged_prompts):
    reference = dk.generate(idle_top, ragged_prompts, max_new_tokens=60, eos_token_id=()).sequences
    drafter = DynamicExitDrafter([1, 2, 3], max_draft=5, probes=1, every=3)
    out = dk.generate(
        idle_top, ragged_prompts, drafter, policy=FixedLength(8), max_new_tokens=60, eos_token_id=(), debug=True
    )
    assert out.sequences == reference
    assert drafter.history[-1] == (2, 5)  # layer 1 disagrees sometimes; layers 2 and 3 never, 2 is cheaper
    assert out.stats.draft_acceptance_rate > 0.9  # only the first choices, before layer 1 was seen to fail, missed


def test_objective():
    score = tokens_per_layer([0.0, 1.0, 0.5], 3, [5, 2, 2], 10)  # [3 candidates, lengths 0..3]
    assert score[0, 0] == pytest.approx(1 / 10)  # plain decoding
    assert score[1, 3] == pytest.approx(4 / 16)
    assert score[2, 2] == pytest.approx((1 + 0.5 + 0.25) / 14)


def test_stops_drafting_when_no_layer_pays(deep, ragged_prompts):
    drafter = DynamicExitDrafter([3], every=1)
    dk.generate(deep, ragged_prompts[:1], drafter, policy=FixedLength(4), max_new_tokens=2, eos_token_id=())
    drafter.hits.fill_(1.0)
    drafter.seen.fill_(10.0)  # 10% agreement at layer 3 of 4: a draft costs 3/4 of a step
    drafter._choose()
    assert drafter.history[-1] == (3, 0) and drafter.draft_len == 0
    drafter.hits.fill_(9.5)
    drafter._choose()
    assert drafter.draft_len > 0


def test_sampling_is_lossless():
    lm = dk.load_model(tiny_llama(0, vocab=8, hidden=32, layers=3, init=0.3))
    drafter = DynamicExitDrafter([1, 2], probes=None, every=1)
    counts, stats = sample_counts(lm, drafter, RejectionVerifier(), FixedLength(2), "T1", seed=41)
    assert_matches(lm.hf, counts, "T1")
    assert stats.drafted > 0


def test_bad_settings_say_what_to_change(deep, ragged_prompts):
    with pytest.raises(ConfigError, match="non-empty list"):
        DynamicExitDrafter([])
    with pytest.raises(ConfigError, match="decay"):
        DynamicExitDrafter([1], decay=1.0)
    with pytest.raises(ConfigError, match="below the target's 4 layers"):
        dk.generate(deep, ragged_prompts, DynamicExitDrafter([2, 4]), max_new_tokens=4)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_one_host_sync_per_choice(deep, temperature):
    """Rounds cost what a draft model's do (2 syncs); reading the estimates costs one more every ``every`` rounds."""
    from tests.unit.test_host_syncs import syncs_per_round

    assert syncs_per_round(deep, DynamicExitDrafter([1, 2, 3], every=4), FixedLength(3), temperature) <= 2 + 1 / 4
