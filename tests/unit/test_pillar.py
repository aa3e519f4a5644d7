"""PillarAttn: the recorded attention equals transformers' eager attention probabilities, attend= restricts each
layer and key/value head, greedy output equal to plain decoding with a sparse draft, the exact output law under
rejection sampling, and the refusals."""

from __future__ import annotations

import pytest
import torch

import decodekit as dk
from decodekit.drafters.pillar import PillarDrafter
from decodekit.errors import ConfigError
from decodekit.masks import chain_mask
from decodekit.models.tiny import tiny_llama
from decodekit.policies import FixedLength
from decodekit.verifiers import RejectionVerifier
from tests.conftest import assert_greedy_twice
from tests.unit.test_lossless import MisreportsQ, assert_detected, assert_matches, sample_counts

TOKENS = torch.tensor([[5, 9, 2, 7, 1, 3, 8], [4, 4, 6, 2, 9, 1, 5]])


@pytest.fixture(scope="module")
def hf():
    return tiny_llama(3, layers=3)  # 4 query heads over 2 key/value heads


def forward(lm, tokens=TOKENS, **kwargs):
    cache = lm.new_cache(tokens.shape[0], 16)
    view = cache.stage(tokens.shape[1])
    mask, positions = chain_mask(cache.lengths, tokens.shape[1], view.kv_len)
    return lm.forward(tokens, positions, mask, view, **kwargs)


def test_recorded_attention_is_the_eager_attention(hf):
    lm, sink = dk.load_model(hf), {}
    lm.record_attention(sink)
    recorded = forward(lm)
    torch.testing.assert_close(recorded.logits, forward(lm).logits)  # recording changes no output
    assert sorted(sink) == [0, 1, 2] and lm._take_sink() is None  # one forward only
    eager = tiny_llama(3, layers=3)  # the same weights
    eager.set_attn_implementation("eager")
    probs = eager(TOKENS, output_attentions=True).attentions  # per layer [B, Hq, Q, S]
    for i, p in enumerate(probs):
        expected = p.reshape(2, 2, 2, 7, 7).sum((2, 3))  # query head h reads key/value head h // 2
        torch.testing.assert_close(sink[i][..., :7], expected, atol=1e-5, rtol=1e-4)


def test_attend_restricts_each_layer_and_head(hf):
    lm = dk.load_model(hf)
    everything = torch.ones(3, 2, 2, 7, dtype=torch.bool)
    torch.testing.assert_close(forward(lm, attend=everything).logits, forward(lm).logits)
    attend = everything.clone()
    attend[:, :, 0, 1:4] = False  # key/value head 0 of every layer loses slots 1..3
    sink = {}
    lm.record_attention(sink)
    restricted = forward(lm, attend=attend)
    for mass in sink.values():
        assert mass[:, 0, 1:4].abs().max() == 0 and mass[:, 1, 1:4].min() > 0  # only head 0 lost them
    assert not torch.allclose(restricted.logits, forward(lm).logits)
    with pytest.raises(ConfigError, match="attend="):
        forward(lm, attend=everything, exit_layer=2)


def test_greedy_equals_plain_decoding(hf, ragged_prompts):
    lm = dk.load_model(hf)
    reference = dk.generate(lm, ragged_prompts, max_new_tokens=30, eos_token_id=()).sequences
    drafter, dense = PillarDrafter(keep=2, fraction=0.0), []
    observe = drafter.observe

    def spy(state, round):
        observe(state, round)
        dense.append(bool(drafter.attend.all()))

    drafter.observe = spy
    assert_greedy_twice(lm, ragged_prompts, drafter, FixedLength(3), reference, 30)
    assert dense and not any(dense)  # two pillars per layer and head: every round's draft attends sparsely


def test_full_attention_pillars_draft_what_the_target_would():
    """Keeping every slot, the draft is the target's own greedy continuation: every draft is accepted (with two
    pillars, not: the test above)."""
    lm = dk.load_model(tiny_llama(5, layers=2))
    for keep, rate in ((64, 1.0), (1, None)):
        out = dk.generate(
            lm, [[3, 1, 4, 1, 5, 9, 2, 6]], PillarDrafter(keep, 0.0), None, FixedLength(4), max_new_tokens=20
        )
        assert (out.stats.draft_acceptance_rate == 1.0) == (rate == 1.0)


@pytest.fixture(scope="module")
def small_vocab():
    return dk.load_model(tiny_llama(0, vocab=8, hidden=32, layers=3, init=0.3))


class PresetPillars(PillarDrafter):
    """Pillars from the first draft step on (the exact-law test generates 3 tokens: one round, whose first draft
    step would otherwise run dense): every layer and head drops the first slot until the first verification."""

    def begin(self, state, target, cache):
        super().begin(state, target, cache)
        self.attend = torch.tensor([False, True]).expand(target.num_layers, state.batch_size, 2, 2)


def test_sampling_is_lossless(small_vocab):
    counts, stats = sample_counts(small_vocab, PresetPillars(keep=1), RejectionVerifier(), FixedLength(2), "T1", 41)
    assert_matches(small_vocab.hf, counts, "T1")
    assert 0.05 < stats.draft_acceptance_rate < 1.0


def test_a_drafter_that_misreports_q_is_detected(small_vocab):
    drafter = MisreportsQ(PresetPillars(keep=1))
    counts, _ = sample_counts(small_vocab, drafter, RejectionVerifier(), FixedLength(2), "T1", seed=42)
    assert_detected(small_vocab.hf, counts, "T1")


def test_refusals(ragged_prompts):
    eager = tiny_llama(3, layers=3)
    eager.set_attn_implementation("eager")
    with pytest.raises(ConfigError, match="sdpa"):
        dk.generate(dk.load_model(eager), ragged_prompts, PillarDrafter(), max_new_tokens=4)
    with pytest.raises(ConfigError, match="keep"):
        PillarDrafter(keep=0)
    assert isinstance(dk.build("drafter", "pillar"), PillarDrafter)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_no_host_syncs_of_its_own(hf, temperature):
    from tests.unit.test_host_syncs import syncs_per_round

    assert syncs_per_round(dk.load_model(hf), PillarDrafter(keep=2), FixedLength(3), temperature) <= 2
