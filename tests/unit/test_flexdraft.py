"""The ``flexdraft`` drafter (the target drafting through mask slots, the attention projections of its last layers
tuned for them): the autoregressive path is the target's exactly (a head whose tuned projections are far from the
target's still gives the pending token the target's own logits, and a variant that tunes every position does not);
the training layout (every block of a sequence in one forward, no cache) gives the drafter's block logits; greedy
output equals plain decoding on ragged rows; sampled output keeps the target's law, and a misreported ``q`` is
detected; the loss learns on self-distilled data; no host syncs; its refusals."""

from __future__ import annotations

import pytest
import torch

import decodekit as dk
from decodekit.drafters.flexdraft import FlexDraftDrafter, block_logits
from decodekit.drafters.flexdraft_head import FlexDraftHead
from decodekit.drafters.head_files import head_metadata
from decodekit.errors import ConfigError
from decodekit.masks import chain_mask
from decodekit.models.tiny import tiny_llama
from decodekit.policies import FixedLength
from decodekit.train.blocks import BlockObjective, sample_anchors
from decodekit.train.flexdraft import entry_states, flex_layout, flex_outputs
from decodekit.train.layer_features import final_states
from decodekit.train.recipe import Batch
from decodekit.verifiers import RejectionVerifier
from tests.unit.test_host_syncs import count_syncs
from tests.unit.test_lossless import MisreportsQ, assert_detected, assert_matches, sample_counts

BLOCK = 4


def save(head: FlexDraftHead, target, path) -> str:
    head.save(path, head_metadata(target, **head.file_fields()))
    return str(path)


def fit(head: FlexDraftHead, target, steps: int, seed: int = 0) -> list[dict[str, float]]:
    """``steps`` of the recipe's loss on the target's own greedy continuations of random prompts."""
    gen = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(0, target.vocab_size, (6,), generator=gen).tolist() for _ in range(48)]
    outs = dk.generate(target, prompts, max_new_tokens=34, eos_token_id=()).sequences
    tokens = torch.tensor([p + s for p, s in zip(prompts, outs)])
    lengths, starts = torch.full((len(tokens),), tokens.shape[1]), torch.full((len(tokens),), 6)
    feats, w = final_states(target, tokens), target.lm_head.weight.detach()
    states = entry_states(head, target, tokens)
    target.hf.requires_grad_(False)
    opt = torch.optim.AdamW(head.parameters(), lr=3e-3)
    stats = []
    for _ in range(steps):
        idx = torch.randint(0, len(tokens), (16,), generator=gen)
        blocks = sample_anchors(lengths[idx], starts[idx], 8, gen)
        batch = Batch(tokens[idx], feats[idx], lengths[idx], starts[idx])
        outputs = lambda t, a: flex_outputs(head, target, states[idx], a)  # noqa: B023, E731
        loss, st = BlockObjective(8, 2.0).loss(outputs, batch, w, blocks)
        opt.zero_grad()
        loss.backward()
        opt.step()
        stats.append({"loss": float(loss.detach()), **st})
    return stats


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny target (32 tokens, 3 layers) and a FlexDraft head tuning its last two layers, trained for a few steps."""
    target = dk.load_model(tiny_llama(0, vocab=32, layers=3, init=0.4))
    torch.manual_seed(0)
    head = FlexDraftHead(target, 2, BLOCK)
    head.init_from(target)
    stats = fit(head, target, 200)
    return target, head.eval(), save(head, target, tmp_path_factory.mktemp("flexdraft") / "head.safetensors"), stats


def test_training_learns_on_self_distilled_data(trained):
    stats = trained[3]
    first, last = stats[:5], stats[-10:]
    assert sum(s["loss"] for s in last) / len(last) < 0.8 * sum(s["loss"] for s in first) / len(first)
    assert sum(s["accept"] for s in last) > sum(s["accept"] for s in first)


def _block(head, target, ids: torch.Tensor) -> torch.Tensor:
    """``block_logits`` after ``ids [B, T]`` committed (the last token pending)."""
    cache = target.new_cache(ids.shape[0], ids.shape[1] + BLOCK)
    with torch.no_grad():
        view = cache.stage(ids.shape[1] - 1)
        mask, positions = chain_mask(cache.lengths, ids.shape[1] - 1, view.kv_len)
        target.forward(ids[:, :-1], positions, mask, view)
        cache.keep(torch.full((ids.shape[0],), ids.shape[1] - 1))
        return block_logits(head, target, cache, ids[:, -1])


class EveryPosition(FlexDraftHead):
    """A biased variant: the tuned projections at every position of the block, the pending token's too."""

    def forward(self, target, x, frozen, positions, mask, cache=None):
        return super().forward(target, x, 0, positions, mask, cache)


def test_the_pending_token_keeps_the_targets_own_path(trained):
    target, head, _, _ = trained
    far = FlexDraftHead(target, 1, BLOCK)  # random projections, far from the target's
    ids = torch.randint(0, 32, (2, 9), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        plain = target.hf(ids).logits[:, -1]
    torch.testing.assert_close(_block(far, target, ids)[:, 0], plain, rtol=1e-4, atol=1e-4)
    biased = EveryPosition(target, 1, BLOCK)
    biased.load_state_dict(far.state_dict())
    assert not torch.allclose(_block(biased, target, ids)[:, 0], plain, rtol=1e-2, atol=1e-2)


def test_qwen3s_query_and_key_norms_are_tuned_at_the_mask_slots_only():
    """On a Qwen3 target the head carries copies of the query / key norms: changing them moves the mask slots'
    logits, never the pending token's (the target's own)."""
    from tests.unit.test_lean_forward import family_model

    target = dk.load_model(family_model("qwen3"))
    torch.manual_seed(1)
    head = FlexDraftHead(target, 1, BLOCK)
    head.init_from(target)
    ids = torch.randint(0, 128, (2, 9), generator=torch.Generator().manual_seed(7))
    before = _block(head, target, ids)
    with torch.no_grad():
        head.tuned[0]["q_norm"].weight.mul_(3.0)
        head.tuned[0]["k_norm"].weight.add_(0.5)
    after = _block(head, target, ids)
    with torch.no_grad():
        plain = target.hf(ids).logits[:, -1]
    torch.testing.assert_close(after[:, 0], plain, rtol=1e-4, atol=1e-4)
    assert not torch.allclose(after[:, 1:], before[:, 1:], rtol=1e-2, atol=1e-2)


def test_the_training_layout_gives_the_drafters_blocks(trained):
    """Every block of a sequence in one forward without a cache (training) = each block drafted after the cached
    context (inference), slot for slot."""
    target, head, _, _ = trained
    tokens = torch.randint(0, 32, (2, 12), generator=torch.Generator().manual_seed(6))
    anchors = torch.tensor([[3, 7, 9], [5, 5, 10]])
    with torch.no_grad():
        out, at = flex_outputs(head, target, entry_states(head, target, tokens), anchors)
        got = target.head(out)  # [B, A, BLOCK - 1, V]
        for row in range(2):
            for i, a in enumerate(anchors[row].tolist()):
                want = _block(head, target, tokens[row : row + 1, : a + 1])[0, 1:]
                torch.testing.assert_close(got[row, i], want, rtol=1e-4, atol=1e-4)
    assert at[0, 0].tolist() == [5, 6, 7]  # slot j of the block at anchor a predicts the token at a + j + 1


def test_the_training_mask():
    positions, mask = flex_layout(4, torch.tensor([[1, 2]]), 3)
    assert positions[0].tolist() == [0, 1, 2, 3, 2, 3, 3, 4]
    m = mask[0, 0].int().tolist()
    assert m[2] == [1, 1, 1, 0, 0, 0, 0, 0]  # the sequence: causal, no mask slot
    assert m[4] == m[5] == [1, 1, 0, 0, 1, 1, 0, 0]  # anchor 1's slots: the sequence up to 1, their own block
    assert m[6] == m[7] == [1, 1, 1, 0, 0, 0, 1, 1]


def test_greedy_equals_plain_decoding(trained, ragged_prompts):
    target, _, path, _ = trained
    ragged_prompts = [[t % 32 for t in p] for p in ragged_prompts]
    plain = dk.generate(target, ragged_prompts, max_new_tokens=24, eos_token_id=()).sequences
    for k in (1, 3, 6):  # 6: more than the block drafts (capped at 4)
        out = dk.generate(target, ragged_prompts, FlexDraftDrafter(path), policy=FixedLength(k), max_new_tokens=24,
                          eos_token_id=(), debug=True)  # fmt: skip
        assert out.sequences == plain, k
        assert len(out.stats.drafted_per_pos) <= BLOCK
        assert out.stats.accepted_per_pos[0] == out.stats.drafted_per_pos[0]  # the first draft is the target's own
        if k > 1:
            assert 0 < out.stats.accepted < out.stats.drafted, k


class RecordsBlocks(FlexDraftDrafter):
    """Keeps each round's block logits, budget lengths and draft validity."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.rounds = []

    def _block(self, state):
        self.logits = super()._block(state)
        return self.logits

    def propose(self, state, budget):
        draft = super().propose(state, budget)
        self.rounds.append((self.logits, budget.lengths.clone(), draft.valid.sum(1)))
        return draft


def test_the_verification_length_follows_the_drafts_confidence(trained, ragged_prompts):
    """``confidence=c`` (0.01, the release's default): a row keeps its first draft (the target's own), then
    mask-slot drafts while the product of their top-1 probabilities is at least ``c`` (FlexDraft's rule), and greedy
    output stays plain decoding's."""
    target, _, path, _ = trained
    prompts = [[t % 32 for t in p] for p in ragged_prompts]
    plain = dk.generate(target, prompts, max_new_tokens=24, eos_token_id=()).sequences
    drafter = RecordsBlocks(path, confidence=0.01)
    out = dk.generate(target, prompts, drafter, policy=FixedLength(BLOCK), max_new_tokens=24, eos_token_id=(),
                      debug=True)  # fmt: skip
    assert out.sequences == plain
    cut = longer = 0
    for logits, lengths, kept in drafter.rounds:
        product = logits[:, 1:].softmax(-1).amax(-1).cumprod(1)  # [B, BLOCK - 1]
        want = torch.minimum(1 + (product >= 0.01).sum(1), lengths)
        assert kept.tolist() == want.tolist()
        cut, longer = cut + int((want < lengths).sum()), longer + int((want >= 3).sum())
    assert cut > 0 and longer > 0  # the rule cut rows, and not all of them to the first mask draft
    with pytest.raises(ConfigError, match="confidence"):
        FlexDraftDrafter(path, confidence=1.5)


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """The lossless harness's 8-token target (two layers) and a random FlexDraft head tuning its last layer."""
    model = tiny_llama(0, vocab=8, hidden=32, init=0.3)
    target = dk.load_model(model)
    torch.manual_seed(4)
    head = FlexDraftHead(target, 1, 3)
    return model, save(head, target, tmp_path_factory.mktemp("flexdraft_small") / "head.safetensors")


class FromTheMaskSlots(FlexDraftDrafter):
    """The harness below scores one draft a round, which for ``flexdraft`` is the target's own (always accepted):
    this variant drafts from the mask slots only, slot ``j``'s ``q`` for the ``j``-th draft (honestly reported), so
    the mask slots' sampling is what the test sees."""

    def _block(self, state):
        return super()._block(state)[:, 1:]

    def propose(self, state, budget):
        self.block_size = self.head.block_size - 1 if self.head is not None else self.block_size
        return super().propose(state, budget)


@pytest.mark.parametrize(("setting", "confidence"), [("T1", 0.0), ("T0.7-p0.9", 0.0), ("T1", 0.4)])
def test_sampling_is_lossless(small, setting, confidence):
    model, path = small
    drafter = FromTheMaskSlots(path, confidence=confidence)
    counts, stats = sample_counts(model, drafter, RejectionVerifier(), FixedLength(3), setting, seed=41)
    assert_matches(model, counts, setting)
    assert 0.05 < stats.draft_acceptance_rate < 0.95


def test_the_first_draft_is_always_accepted_when_sampling(small):
    """The pending token's output is the target's own distribution, so its draft passes rejection sampling with
    probability 1 at any temperature (and the law stays the target's)."""
    model, path = small
    counts, stats = sample_counts(model, FlexDraftDrafter(path), RejectionVerifier(), FixedLength(3), "T1", seed=42)
    assert_matches(model, counts, "T1")
    assert stats.drafted > 0 and stats.acceptance_rate_per_pos[0] == 1.0 > stats.acceptance_rate_per_pos[1]


def test_a_misreported_q_is_detected(small):
    model, path = small
    drafter = MisreportsQ(FromTheMaskSlots(path))
    counts, _ = sample_counts(model, drafter, RejectionVerifier(), FixedLength(3), "T1", 43)
    assert_detected(model, counts, "T1")


def test_refusals(trained, small, tmp_path):
    target, _, path, _ = trained
    with pytest.raises(ConfigError, match="no FlexDraft head at"):
        FlexDraftDrafter(tmp_path / "missing.safetensors")
    with pytest.raises(ConfigError, match="trained for"):
        FlexDraftDrafter(small[1], target=target)  # the 8-token target's head on the 32-token target
    with pytest.raises(ConfigError, match="tuned layers must be"):
        FlexDraftHead(target, 3, BLOCK)
    with pytest.raises(ConfigError, match="Llama-family"):
        FlexDraftHead(object(), 1, BLOCK)


class CountsSyncs(FlexDraftDrafter):
    syncs = 0

    def propose(self, state, budget):
        with count_syncs() as counter:
            draft = super().propose(state, budget)
        self.syncs += counter[0]
        return draft


def test_drafting_reads_nothing_from_the_device(trained, ragged_prompts):
    target, _, path, _ = trained
    drafter = CountsSyncs(path)
    out = dk.generate(target, [[t % 32 for t in p] for p in ragged_prompts[:2]], drafter, policy=FixedLength(3),
                      max_new_tokens=16, eos_token_id=())  # fmt: skip
    assert out.stats.num_drafts > 5 and drafter.syncs == 0
