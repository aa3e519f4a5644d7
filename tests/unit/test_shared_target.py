"""A drafter that drafts with the target itself: it gets the target and its cache in ``begin``, runs the target's
first layers on its draft tokens in the target's own cache (staged at offsets past the committed length), and
verification overwrites those slots. Greedy output equals plain decoding."""

from __future__ import annotations

import pytest
import torch

import decodekit as dk
from decodekit.masks import chain_mask
from decodekit.models.tiny import tiny_llama


class FirstLayersDrafter:
    """Minimal self-speculation: draft greedily with the target's first ``layers`` layers (LayerSkip-style early
    exit without a trained head), in the target's KV cache."""

    shares_target = True

    def __init__(self, layers: int) -> None:
        self.layers = layers
        self.extents: list[list[int]] = []

    def draft_kind(self, sampling: dk.SamplingParams) -> dk.DraftKind:
        return dk.DraftKind.DETERMINISTIC

    def begin(self, state: dk.DecodeState, target: dk.LanguageModel, cache: dk.KVCache) -> None:
        self.target, self.cache = target, cache

    def propose(self, state: dk.DecodeState, budget: dk.DraftBudget) -> dk.Draft:
        x, tokens = state.pending, []
        for j in range(budget.max_len):  # step j runs the token at position L_b + j, staged at offset j
            view = self.cache.stage(1, offset=j)
            mask, positions = chain_mask(self.cache.lengths + j, 1, view.kv_len)
            out = self.target.forward(x[:, None], positions, mask, view, exit_layer=self.layers)
            x = out.logits[:, -1].argmax(-1)
            tokens.append(x)
        self.extents.append([self.cache.staged_extent(i) for i in range(self.target.num_layers)])
        return dk.Draft.chain(torch.stack(tokens, 1), valid=budget.mask())


@pytest.fixture(scope="module")
def deep_target():
    return tiny_llama(3, layers=4)


@pytest.mark.parametrize("layers", [1, 2, 4])
def test_self_speculation_in_the_targets_cache_is_greedy_decoding(deep_target, ragged_prompts, layers):
    plain = dk.generate(deep_target, ragged_prompts, max_new_tokens=30, eos_token_id=())
    drafter = FirstLayersDrafter(layers)
    out = dk.generate(
        deep_target,
        ragged_prompts,
        drafter=drafter,
        policy=dk.policies.FixedLength(3),
        max_new_tokens=30,
        eos_token_id=(),
        debug=True,
    )
    assert out.sequences == plain.sequences
    assert out.stats.num_drafts > 0
    # the drafter filled exactly its layers' staged slots (the pending token + 2 of 3 drafted tokens ran)
    assert drafter.extents[0] == [3 if i < layers else 0 for i in range(4)]
    if layers == 4:  # the whole target drafts: every draft is accepted, so the staged K/V were right
        assert out.stats.draft_acceptance_rate == 1.0


def test_only_drafters_that_declare_it_get_the_target():
    seen = []

    class Plain:
        def begin(self, state):
            seen.append("plain")

        def propose(self, state, budget):
            return dk.Draft.chain(state.pending[:, None].expand(-1, budget.max_len), valid=budget.mask())

    dk.generate(tiny_llama(0), [[1, 2, 3]], drafter=Plain(), max_new_tokens=4)
    assert seen == ["plain"]
