"""Speculative decoding at temperature 0 equals transformers' greedy generate, token for token (float32)."""

from __future__ import annotations

import pytest
import torch

import decodekit as dk
from decodekit.drafters import ModelDrafter, NGramDrafter
from decodekit.models.tiny import perturbed, tiny_llama, tiny_qwen2
from decodekit.policies import FixedLength, HeuristicLength
from decodekit.verifiers import GreedyVerifier, RejectionVerifier

MAX_NEW = 40


def hf_greedy(model, prompt: list[int], max_new: int, eos: int | None = None) -> list[int]:
    """transformers' own greedy decoding of one prompt (batch 1: no padding), cut after EOS."""
    out = model.generate(
        torch.tensor([prompt]), max_new_tokens=max_new, do_sample=False, eos_token_id=eos, pad_token_id=0
    )
    tokens = out[0, len(prompt) :].tolist()
    return tokens[: tokens.index(eos) + 1] if eos is not None and eos in tokens else tokens


@pytest.fixture(scope="module")
def reference(target, ragged_prompts):
    return [hf_greedy(target, p, MAX_NEW) for p in ragged_prompts]


@pytest.fixture(scope="module")
def drafters(target):
    return {
        "ngram": NGramDrafter(),
        "ngram-first-match": NGramDrafter(max_ngram=2, match="first"),
        "model-self": ModelDrafter(target),  # accepts everything
        "model-noisy": ModelDrafter(perturbed(target, 0.5, seed=1)),  # accepts some
        "model-unrelated": ModelDrafter(tiny_llama(7)),  # accepts almost nothing
    }


@pytest.mark.parametrize("k", [1, 3, 6])
@pytest.mark.parametrize("name", ["ngram", "ngram-first-match", "model-self", "model-noisy", "model-unrelated"])
def test_greedy_equals_transformers(target, ragged_prompts, reference, drafters, name, k):
    out = dk.generate(
        target, ragged_prompts, drafters[name], policy=FixedLength(k), max_new_tokens=MAX_NEW, eos_token_id=()
    )
    assert out.sequences == reference
    assert out.stats.generated == 4 * MAX_NEW
    if name == "model-self":  # a perfect draft is always accepted (rounds near the end are budget-capped)
        assert out.stats.accepted == out.stats.drafted > 0
    if name in ("ngram", "model-noisy"):  # the test must exercise partial acceptance, not only rejection
        assert 0 < out.stats.accepted < out.stats.drafted


def test_autoregressive_equals_transformers(target, ragged_prompts, reference):
    out = dk.generate(target, ragged_prompts, max_new_tokens=MAX_NEW, eos_token_id=())
    assert out.sequences == reference
    assert out.stats.drafted == 0 and out.stats.tokens_per_step == 1.0


def test_rejection_verifier_at_temperature_zero_is_greedy(target, ragged_prompts, reference, drafters):
    out = dk.generate(
        target, ragged_prompts, drafters["model-noisy"], RejectionVerifier(), max_new_tokens=MAX_NEW, eos_token_id=()
    )
    assert out.sequences == reference


def test_heuristic_policy_keeps_greedy_output(target, ragged_prompts, reference, drafters):
    out = dk.generate(
        target,
        ragged_prompts,
        drafters["model-noisy"],
        policy=HeuristicLength(),
        max_new_tokens=MAX_NEW,
        eos_token_id=(),
    )
    assert out.sequences == reference


def test_rows_stop_at_eos_independently(target, ragged_prompts, reference, drafters):
    eos = reference[0][10]  # a token row 0 emits mid-way; other rows may or may not emit it
    expected = [hf_greedy(target, p, MAX_NEW, eos=eos) for p in ragged_prompts]
    out = dk.generate(target, ragged_prompts, drafters["model-self"], max_new_tokens=MAX_NEW, eos_token_id=eos)
    assert out.sequences == expected
    assert out.finish_reasons == ["eos" if s[-1] == eos else "length" for s in expected]
    assert len(out.sequences[0]) <= 11


def test_qwen2_target(ragged_prompts):
    qwen = tiny_qwen2(3)
    expected = [hf_greedy(qwen, p, 24) for p in ragged_prompts]
    for drafter in (NGramDrafter(), ModelDrafter(perturbed(qwen, 0.5, seed=2))):
        out = dk.generate(qwen, ragged_prompts, drafter, max_new_tokens=24, eos_token_id=())
        assert out.sequences == expected


class DecoyTreeDrafter:
    """A tree drafter for tests: along the target's own greedy continuation, every node has a decoy sibling
    listed *before* it, so the accepted path is nodes 1, 3, 5, ... and the cache must gather it. With ``break_at``
    the true path is corrupted at that depth, so acceptance stops there."""

    def __init__(self, model, depth: int, break_at: int | None = None) -> None:
        self.model, self.depth, self.break_at = model, depth, break_at

    def propose(self, state: dk.DecodeState, budget: dk.DraftBudget) -> dk.Draft:
        batch, vocab = state.batch_size, self.model.config.vocab_size
        depth = min(self.depth, budget.max_len // 2)
        if depth == 0:
            return dk.Draft.empty(batch)
        tokens, parents = (
            torch.zeros(batch, 2 * depth, dtype=torch.long),
            torch.zeros(batch, 2 * depth, dtype=torch.long),
        )
        for b in range(batch):
            seq = state.tokens[b, : state.lengths[b]].tolist()
            for d in range(depth):
                nxt = int(self.model(torch.tensor([seq])).logits[0, -1].argmax())
                true = (nxt + 1) % vocab if d == self.break_at else nxt
                tokens[b, 2 * d], tokens[b, 2 * d + 1] = (nxt + 7) % vocab, true
                parents[b, 2 * d] = parents[b, 2 * d + 1] = 2 * d - 1  # both hang off the previous true node
                seq.append(true)
        valid = torch.arange(2 * depth) < (budget.lengths[:, None] // 2) * 2
        return dk.Draft(tokens=tokens, parents=parents, valid=valid)


@pytest.mark.parametrize("break_at", [None, 1])
def test_tree_draft_greedy_equals_transformers(target, ragged_prompts, reference, break_at):
    drafter = DecoyTreeDrafter(target, depth=3, break_at=break_at)
    out = dk.generate(
        target, ragged_prompts, drafter, GreedyVerifier(), FixedLength(6), max_new_tokens=MAX_NEW, eos_token_id=()
    )
    assert out.sequences == reference
    per_round = 3 if break_at is None else 1
    assert out.stats.acceptance_histogram[per_round] > 0
    assert max(i for i, c in enumerate(out.stats.acceptance_histogram) if c) == per_round


def test_an_eos_inside_accepted_drafts_cuts_the_targets_cache_back():
    """Rows that end at an EOS inside a round's accepted draft tokens (here row 0, in the draft model's run): the
    row is cut at its EOS, and the target's cache drops the K/V it kept past it, so every round's debug check of the
    cache's host mirror passes (before the fix it failed: mirror 16, lengths 17); output = plain decoding's."""
    target = dk.load_model(tiny_llama(0))
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 128, (n,), generator=gen).tolist() for n in [7, 2, 13, 4]]
    plain = dk.generate(target, prompts, max_new_tokens=24, eos_token_id=39).sequences
    drafter = ModelDrafter(perturbed(tiny_llama(0), 0.1, seed=1))
    out = dk.generate(target, prompts, drafter, policy=FixedLength(4), max_new_tokens=24, eos_token_id=39, debug=True)
    assert out.sequences == plain and len({len(s) for s in plain}) > 1
