"""Medusa heads: trained here on tiny targets with the recipe's own loss; greedy output equal to plain decoding,
the exact output law at temperature 1 (deterministic drafts verified as point masses), the refusals."""

from __future__ import annotations

import pytest
import torch

import decodekit as dk
from decodekit.drafters.medusa import MedusaDrafter, MedusaHeads
from decodekit.errors import ConfigError
from decodekit.kernels.cpu import PackedLinear
from decodekit.models.tiny import tiny_llama
from decodekit.policies import FixedLength
from decodekit.train.feature_data import target_features
from decodekit.train.medusa import medusa_loss
from decodekit.trees import TreeTemplate
from decodekit.verifiers import RejectionVerifier, TraversalVerifier
from tests.conftest import assert_greedy_twice
from tests.unit.test_eagle import head_file, sequences
from tests.unit.test_lossless import assert_matches, sample_counts


def train_heads(lm: dk.LanguageModel, steps: int, num_heads: int = 3, seed: int = 0) -> MedusaHeads:
    data = target_features(lm, sequences(lm, 96, 40, seed), seq_len=48, batch_size=32, progress=False)
    torch.manual_seed(seed)
    heads = MedusaHeads(lm.hf.config.hidden_size, num_heads, torch.arange(lm.vocab_size))
    optimizer = torch.optim.Adam(heads.parameters(), lr=3e-3)
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        idx = torch.randint(0, len(data["lengths"]), (16,), generator=gen)
        loss, _ = medusa_loss(heads, lm.lm_head.weight, data["feats"][idx], data["lengths"][idx])
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    return heads.eval()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    lm = dk.load_model(tiny_llama(0))
    return lm, head_file(tmp_path_factory, lm, train_heads(lm, 100), "tiny")


def test_untrained_heads_are_the_targets_next_token_head():
    """W_k starts at zero: every head first predicts what the output head itself predicts."""
    heads = MedusaHeads(64, 3, torch.arange(128))
    f = torch.randn(5, 64)
    assert torch.equal(heads(f), f[:, None].expand(-1, 3, -1))


def test_training_lowers_the_loss():
    lm = dk.load_model(tiny_llama(3))
    data = target_features(lm, sequences(lm, 32, 40, seed=0), seq_len=48, batch_size=32, progress=False)
    losses = []
    for steps in (0, 150):
        heads = train_heads(lm, steps)
        with torch.no_grad():
            losses.append(float(medusa_loss(heads, lm.lm_head.weight, data["feats"], data["lengths"])[0]))
    assert losses[1] < 0.9 * losses[0], losses


def test_greedy_equals_plain_decoding(tiny, ragged_prompts):
    lm, path = tiny
    reference = dk.generate(lm, ragged_prompts, max_new_tokens=40, eos_token_id=()).sequences
    assert_greedy_twice(lm, ragged_prompts, MedusaDrafter(path), FixedLength(3), reference, 40)


def test_sampling_is_lossless(tmp_path_factory):
    lm = dk.load_model(tiny_llama(0, vocab=8, hidden=32, init=0.3))
    path = head_file(tmp_path_factory, lm, train_heads(lm, 80, num_heads=2), "tiny8")
    counts, stats = sample_counts(lm, MedusaDrafter(path), RejectionVerifier(), FixedLength(2), "T1", seed=31)
    assert_matches(lm.hf, counts, "T1")
    assert 0.05 < stats.draft_acceptance_rate < 0.95


def test_refusals(tiny, tmp_path, ragged_prompts):
    _, path = tiny
    with pytest.raises(ConfigError, match="recipe=medusa"):
        MedusaDrafter(tmp_path / "absent.safetensors")
    with pytest.raises(ConfigError, match="other weights"):
        MedusaDrafter(path, target=dk.load_model(tiny_llama(5)))


# -------------------------------------------------------------------------------------------- sparse trees
def test_tree_greedy_equals_plain_decoding_and_beats_the_chain(tiny, ragged_prompts):
    lm, path = tiny
    reference = dk.generate(lm, ragged_prompts, max_new_tokens=40, eos_token_id=()).sequences
    drafter = MedusaDrafter(path, template="smollm2_12")
    assert_greedy_twice(lm, ragged_prompts, drafter, FixedLength(10), reference, 40)
    lengths = [
        dk.generate(lm, ragged_prompts, d, policy=p, max_new_tokens=40, eos_token_id=()).stats.mean_acceptance_length
        for d, p in ((MedusaDrafter(path), FixedLength(3)), (drafter, FixedLength(10)))
    ]
    assert lengths[1] > lengths[0], lengths  # the chain is the tree's rank-0 spine


def test_tree_nodes_are_the_heads_ranked_tokens(tiny, ragged_prompts):
    """Node (r1, ..., rd) drafts head d's rd-th token; the budget keeps the shallowest nodes, at most 3 deep."""
    lm, path = tiny
    drafter = MedusaDrafter(path, template=TreeTemplate(((0,), (1,), (0, 0), (0, 1), (0, 0, 0), (0, 0, 0, 0))))
    dk.generate(lm, ragged_prompts[:1], drafter, max_new_tokens=2, eos_token_id=())  # loads the heads, sets f
    state_f = torch.randn(1, lm.hf.config.hidden_size)  # any feature
    budget = dk.DraftBudget(torch.tensor([5]), node_bound=5)
    scores = drafter.trimmed.scores(drafter.heads(state_f)[:, :3])
    draft = drafter._tree(scores, budget)
    ranked = scores.topk(2, -1).indices[0]  # [3 heads, 2]
    assert draft.tokens[0].tolist() == [ranked[0, 0], ranked[0, 1], ranked[1, 0], ranked[1, 1], ranked[2, 0]]
    assert draft.parents[0].tolist() == [-1, -1, 0, 0, 2]


def test_heads_take_the_targets_cpu_kernels(tiny, ragged_prompts):
    """A target with packed oneDNN linears gets packed heads (trimmed output head included), same greedy output."""
    lm, path = tiny
    packed = dk.load_model(tiny_llama(0), kernels="onednn")
    drafter = MedusaDrafter(path, target=packed)
    assert type(drafter.trimmed.proj) is PackedLinear
    assert not any(type(m) is torch.nn.Linear for m in drafter.heads.modules())
    reference = dk.generate(packed, ragged_prompts, max_new_tokens=30, eos_token_id=()).sequences
    out = dk.generate(packed, ragged_prompts, drafter, policy=FixedLength(3), max_new_tokens=30, eos_token_id=())
    assert out.sequences == reference and out.stats.accepted > 0


def test_tree_sampling_is_lossless(tmp_path_factory):
    lm = dk.load_model(tiny_llama(0, vocab=8, hidden=32, init=0.3))
    path = head_file(tmp_path_factory, lm, train_heads(lm, 80, num_heads=2), "tiny8t")
    drafter = MedusaDrafter(path, template=TreeTemplate(((0,), (1,), (0, 0), (1, 0))))
    counts, stats = sample_counts(lm, drafter, TraversalVerifier(), FixedLength(4, depth=2), "T0.7-p0.9", seed=32)
    assert_matches(lm.hf, counts, "T0.7-p0.9")
    assert stats.accepted > 0
