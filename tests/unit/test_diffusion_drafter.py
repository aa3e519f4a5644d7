"""The ``diffusion`` drafter (a diffusion LM drafts a block for an autoregressive target): greedy output equals
plain decoding with drafts accepted and rejected (bidirectional and block-causal DLMs, one and two denoising steps,
ragged rows); sampled output keeps the target's exact law (the lossless harness of ``test_lossless.py``), and the
same drafter committing its slots by confidence instead of left to right fails that test; its refusals."""

from __future__ import annotations

import pytest
import torch

import decodekit as dk
from decodekit.draft.templates import TreeTemplate
from decodekit.drafters import DiffusionDrafter
from decodekit.drafters.model import feed_unseen
from decodekit.errors import ConfigError
from decodekit.models.tiny import perturbed, tiny_llama
from decodekit.policies import FixedLength
from decodekit.sampling import probs_from_logits, sample
from decodekit.verifiers import RejectionVerifier, SpecInferVerifier, TraversalVerifier
from tests.unit.test_lossless import MisreportsQ, assert_detected, assert_matches, sample_counts


@pytest.fixture(scope="module")
def target():
    return dk.load_model(tiny_llama(0))


def block_dlm(model, mask: int, block: int) -> dk.dlm.DLMModel:
    """``model`` read as a shifted block-causal DLM: slot 0's logits are the model's next-token logits after the
    committed context (always right under greedy verification), the later slots' a guess (often wrong)."""
    return dk.dlm.DLMModel(dk.load_model(model), mask, shift_logits=True, block_length=block)


@pytest.mark.parametrize(("steps", "cache"), [(1, True), (2, True), (1, False), (2, False)])
def test_greedy_equals_plain_decoding(target, ragged_prompts, steps, cache):
    """A block-causal DLM whose first slot is always right (some drafts accepted, not all) and a random
    bidirectional one (nearly every draft rejected): plain decoding's tokens either way, every round checked."""
    plain = dk.generate(target, ragged_prompts, max_new_tokens=24, eos_token_id=()).sequences
    bidirectional = dk.dlm.load_model(perturbed(target.hf, 0.1, seed=1), mask_token_id=127)
    for dlm in (block_dlm(target.hf, 127, 4), bidirectional):
        drafter = DiffusionDrafter(dlm, steps=steps, cache=cache)
        out = dk.generate(target, ragged_prompts, drafter, policy=FixedLength(4), max_new_tokens=24, eos_token_id=(),
                          debug=True)  # fmt: skip
        assert out.sequences == plain
        if dlm is not bidirectional:
            assert 0 < out.stats.accepted < out.stats.drafted


class TwoForwards(DiffusionDrafter):
    """The cached round as two forwards (the unseen tokens committed, then the slots against the cache without
    being stored): the reference for the one-forward round."""

    def _fed_slot_logits(self, state, slots):
        last = feed_unseen(self.model.lm, self._kv, state)[0].float()
        return self._slot_logits(state, slots, last if self.model.shift_logits else None)


@pytest.mark.parametrize(("block", "shift"), [(None, True), (2, True), (None, False)])
def test_a_cached_round_is_one_forward_with_the_two_forwards_drafts(target, ragged_prompts, block, shift):
    """A cached round runs the DLM once (the unseen tokens and the slots together) and drafts what the two-forward
    round drafts: the same tokens every round (greedy drafts on a DLM that is often wrong: accepted counts equal),
    block-causal or bidirectional, with shifted logits (slot 0 read at the pending token) or not."""
    model = perturbed(target.hf, 0.2, seed=3)
    shifted = block_dlm(model, 127, block) if block else dk.dlm.DLMModel(dk.load_model(model), 127, shift_logits=shift)
    runs = []
    for cls in (DiffusionDrafter, TwoForwards):
        drafter = cls(shifted, steps=2)
        counts = {"forward": 0, "round": 0}
        forward, fed = drafter.model.lm.forward, drafter._fed_slot_logits

        def counted(*args, _forward=forward, _counts=counts, **kwargs):
            _counts["forward"] += 1
            return _forward(*args, **kwargs)

        def first(state, slots, _fed=fed, _counts=counts):
            _counts["round"] += 1
            return _fed(state, slots)

        drafter.model.lm.forward, drafter._fed_slot_logits = counted, first
        out = dk.generate(target, ragged_prompts, drafter, policy=FixedLength(4), max_new_tokens=24, eos_token_id=(),
                          debug=True)  # fmt: skip
        del drafter.model.lm.forward
        runs.append((out.sequences, out.stats.accepted, out.stats.acceptance_rate_per_pos, counts))
    (seqs, accepted, per_pos, counts), (ref_seqs, ref_accepted, ref_per_pos, ref_counts) = runs
    assert seqs == ref_seqs and accepted == ref_accepted and per_pos == ref_per_pos
    assert counts["round"] == ref_counts["round"] > 10
    assert ref_counts["forward"] - counts["forward"] == counts["round"]  # one forward saved a round


@pytest.fixture(scope="module")
def small():
    """The lossless harness's target (8 tokens) and a perturbed copy read as a block-causal DLM (mask id 7)."""
    model = tiny_llama(0, vocab=8, hidden=32, init=0.3)
    return model, block_dlm(perturbed(model, 0.3, seed=5), 7, 2)


@pytest.mark.parametrize(("steps", "setting", "cache"), [(1, "T1", True), (2, "T0.7-p0.9", False)])
def test_sampling_is_lossless(small, steps, setting, cache):
    model, dlm = small
    drafter = DiffusionDrafter(dlm, steps=steps, cache=cache)
    counts, stats = sample_counts(model, drafter, RejectionVerifier(), FixedLength(2), setting, seed=31 + steps)
    assert_matches(model, counts, setting)
    assert 0.05 < stats.draft_acceptance_rate < 0.95


class ByConfidence(DiffusionDrafter):
    """Two slots committed in a diffusion sampler's usual order: the more confident sampled slot first, then the
    other from a forward that sees it; each reports the distribution it was drawn from. The first slot's ``q`` then
    depends on the second's value when the second went first: not its law given the tokens before it."""

    def __init__(self, dlm):
        super().__init__(dlm, steps=2, cache=False)

    def propose(self, state, budget):
        slots = torch.full((state.batch_size, 2), self.model.mask_token_id)
        sampling = self.sampling(state.sampling)
        probs = probs_from_logits(self._slot_logits(state, slots, None), sampling)  # [B, 2, V]
        x = torch.stack([sample(probs[:, j], state.generator, key=("draft", j)) for j in range(2)], 1)
        first = probs.gather(2, x[..., None])[..., 0].argmax(1)  # [B]: the slot committed first
        rows = torch.arange(state.batch_size)
        slots[rows, first] = x[rows, first]
        again = probs_from_logits(self._slot_logits(state, slots, None), sampling)
        second = 1 - first
        x[rows, second] = sample(again[rows, second], state.generator, key=("draft", 2))
        q = probs.clone()
        q[rows, second] = again[rows, second]
        return dk.Draft.chain(x, valid=torch.arange(2) < budget.lengths[:, None], q=q)


def test_committing_by_confidence_is_detected(small):
    model, dlm = small
    counts, _ = sample_counts(model, ByConfidence(dlm), RejectionVerifier(), FixedLength(2), "T1", seed=35)
    assert_detected(model, counts, "T1")


TREE = TreeTemplate(((0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0), (0, 0, 0, 0)))


@pytest.mark.parametrize("cache", [True, False])
def test_trees_of_each_slots_ranked_candidates_equal_plain_decoding(target, ragged_prompts, cache):
    """``template=``: deterministic trees of each slot's top candidates from one forward; plain decoding's tokens
    with drafts accepted and rejected, on a block-causal and a bidirectional DLM."""
    plain = dk.generate(target, ragged_prompts, max_new_tokens=24, eos_token_id=()).sequences
    bidirectional = dk.dlm.load_model(perturbed(target.hf, 0.1, seed=1), mask_token_id=127)
    for dlm in (block_dlm(target.hf, 127, 4), bidirectional):
        drafter = DiffusionDrafter(dlm, cache=cache, template=TREE)
        out = dk.generate(target, ragged_prompts, drafter, policy=FixedLength(6, depth=4), max_new_tokens=24,
                          eos_token_id=(), debug=True)  # fmt: skip
        assert out.sequences == plain
        if dlm is not bidirectional:
            assert 0 < out.stats.accepted < out.stats.drafted


def test_a_tree_node_is_its_slots_ranked_token(target, ragged_prompts):
    """Node ``(r1, ..., rd)`` is slot ``d``'s ``rd``-th most likely token (the mask id never), within the budget."""
    drafter = DiffusionDrafter(block_dlm(perturbed(target.hf, 0.3, seed=2), 127, 4), cache=False, template=TREE)
    seen = []
    propose = drafter.propose

    def spy(state, budget):
        slots = torch.full((state.batch_size, 3), 127)
        seen.append((drafter._slot_logits(state, slots, None), propose(state, budget)))
        return seen[-1][1]

    drafter.propose = spy
    dk.generate(target, ragged_prompts[:2], drafter, policy=FixedLength(5, depth=3), max_new_tokens=8, eos_token_id=())
    logits, draft = seen[0]
    ranked = logits.topk(2, -1).indices  # [B, 3 slots, 2]
    assert draft.parents[0].tolist() == [-1, -1, 0, 0, 1]  # the template's first 5 nodes, 3 deep at most
    for b in range(2):
        assert draft.tokens[b].tolist() == [ranked[b, 0, 0], ranked[b, 0, 1], ranked[b, 1, 0], ranked[b, 1, 1],
                                            ranked[b, 1, 0]]  # fmt: skip
    assert not (draft.tokens == 127).any()


def test_tree_sampling_is_lossless(small):
    model, dlm = small
    drafter = DiffusionDrafter(dlm, template=TreeTemplate(((0,), (1,), (0, 0), (1, 0))))
    assert drafter.draft_kind(dk.SamplingParams(0.7)) is dk.DraftKind.DETERMINISTIC
    counts, stats = sample_counts(model, drafter, TraversalVerifier(), FixedLength(4, depth=2), "T0.7-p0.9", seed=33)
    assert_matches(model, counts, "T0.7-p0.9")
    assert stats.accepted > 0


SMALL_TREE = TreeTemplate(((0,), (1,), (0, 0), (1, 0)))


@pytest.mark.parametrize(("verifier", "setting"), [(SpecInferVerifier, "T1"), (TraversalVerifier, "T0.7-p0.9")])
def test_sampled_trees_keep_the_target_law(small, verifier, setting):
    """``candidates="sampled"``: each node drawn from its slot's distribution, siblings independently, with its
    ``q``: the target's exact law under SpecInfer and traversal verification (chi-square on the exact joint)."""
    model, dlm = small
    drafter = DiffusionDrafter(dlm, template=SMALL_TREE, candidates="sampled")
    assert drafter.draft_kind(dk.SamplingParams(1.0)) is dk.DraftKind.SAMPLED
    counts, stats = sample_counts(model, drafter, verifier(), FixedLength(4, depth=2), setting, seed=37)
    assert_matches(model, counts, setting)
    assert 0.05 < stats.draft_acceptance_rate < 0.95


def test_a_sampled_tree_that_misreports_q_is_detected(small):
    model, dlm = small
    drafter = MisreportsQ(DiffusionDrafter(dlm, template=SMALL_TREE, candidates="sampled"))
    counts, _ = sample_counts(model, drafter, SpecInferVerifier(), FixedLength(4, depth=2), "T1", seed=38)
    assert_detected(model, counts, "T1")


def test_sampled_trees_are_ranked_at_temperature_zero(target, ragged_prompts):
    plain = dk.generate(target, ragged_prompts, max_new_tokens=16, eos_token_id=()).sequences
    drafter = DiffusionDrafter(block_dlm(target.hf, 127, 4), template=TREE, candidates="sampled")
    assert drafter.draft_kind(dk.SamplingParams(0.0)) is dk.DraftKind.DETERMINISTIC
    out = dk.generate(
        target, ragged_prompts, drafter, policy=FixedLength(6, depth=4), max_new_tokens=16, eos_token_id=()
    )
    assert out.sequences == plain and out.stats.accepted > 0


def test_refusals(target):
    with pytest.raises(ConfigError, match="candidates must be one of 'ranked', 'sampled'"):
        DiffusionDrafter(block_dlm(target.hf, 127, 4), template=TREE, candidates="top")
    with pytest.raises(ConfigError, match="template= drafts each slot's ranked candidates from one forward; steps=2"):
        DiffusionDrafter(block_dlm(target.hf, 127, 4), steps=2, template="smollm2_8")
    with pytest.raises(ConfigError, match="steps must be"):
        DiffusionDrafter(block_dlm(target.hf, 127, 4), steps=0)
    with pytest.raises(ConfigError, match="model must be"):
        DiffusionDrafter(3)
    with pytest.raises(ConfigError, match=r"model must be a diffusion LM; got HFCausalLM\. Wrap a causal LM"):
        DiffusionDrafter(target)
    absolute = dk.dlm.DLMModel(target, 127, block_length=4, block_grid="absolute")
    with pytest.raises(ConfigError, match="absolute position grid"):
        DiffusionDrafter(absolute)
    other = dk.dlm.load_model(tiny_llama(0, vocab=64), mask_token_id=63)
    with pytest.raises(Exception, match="vocabulary has 64 tokens but the target's has 128"):
        dk.generate(target, [[1, 2, 3]], DiffusionDrafter(other), max_new_tokens=4)


def test_an_autoregressive_dlm_drafting_slot_by_slot_is_always_accepted(target, ragged_prompts):
    """The target itself read as a shifted DLM with blocks of one slot, drafting one slot a step: slot ``j``'s logits
    are the target's after the slots before it, so under greedy verification every drafted token is accepted (a slot
    read at the wrong position, or a canvas not updated between steps, would be rejected)."""
    ar = block_dlm(target.hf, 127, 1)
    plain = dk.generate(target, ragged_prompts, max_new_tokens=20, eos_token_id=()).sequences
    for cache in (True, False):
        out = dk.generate(target, ragged_prompts, DiffusionDrafter(ar, steps=4, cache=cache), policy=FixedLength(4),
                          max_new_tokens=20, eos_token_id=(), debug=True)  # fmt: skip
        assert out.sequences == plain and out.stats.accepted == out.stats.drafted > 0, cache


def test_draft_alignment_raises_acceptance_on_its_data(target):
    """DEER-style alignment (``draft_alignment_loss``: a clean context cut inside the target's own continuation, the
    next 4 slots all masked, one forward) trains a noisy copy of the target, read as a block-causal DLM, to draft
    what the target then accepts: mean acceptance on the training prompts 1.01-1.02 before, 1.28-1.34 after 200
    steps (measured in two runs)."""
    from decodekit.train.dlm_losses import Regions, draft_alignment_loss

    gen = torch.Generator().manual_seed(0)
    prompts = [
        torch.randint(0, 127, (int(n),), generator=gen).tolist() for n in torch.randint(3, 12, (80,), generator=gen)
    ]
    rows = [p + o for p, o in zip(prompts, dk.generate(target, prompts, max_new_tokens=24, eos_token_id=()).sequences)]
    tokens = torch.tensor([r + [0] * (max(map(len, rows)) - len(r)) for r in rows])
    lengths, starts = torch.tensor([len(r) for r in rows]), torch.tensor([len(p) for p in prompts])
    draft = perturbed(tiny_llama(0), 0.5, seed=3)

    def acceptance() -> float:
        drafter = DiffusionDrafter(block_dlm(draft, 127, 4))
        out = dk.generate(target, prompts[:16], drafter, policy=FixedLength(4), max_new_tokens=24, eos_token_id=())
        return out.stats.mean_acceptance_length

    before = acceptance()
    optimizer = torch.optim.Adam(draft.parameters(), lr=3e-3)
    noise = torch.Generator().manual_seed(1)
    draft.train()
    for _ in range(200):
        i = torch.randint(0, len(rows), (16,), generator=noise)
        loss = draft_alignment_loss(draft, Regions(tokens[i], lengths[i], starts[i]), 127, noise, 4, block_length=4)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    draft.eval()
    assert acceptance() > before + 0.15


def test_a_short_context_tokenizer_of_other_ids_and_a_chain_only_option_are_named():
    """A diffusion LM shorter than the call ran past its positions (an IndexError or silent extrapolation); one whose
    tokenizer numbers tokens otherwise drafted nothing accepted without a word; ``candidates`` without a template was
    accepted and ignored."""
    import tokenizers
    from transformers import PreTrainedTokenizerFast

    def words(order):
        backend = tokenizers.Tokenizer(tokenizers.models.WordLevel({f"w{i}": j for j, i in enumerate(order)}, "w0"))
        return PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="w0")

    target = dk.load_model(tiny_llama(0), words(range(128)))
    short = dk.dlm.DLMModel(dk.load_model(tiny_llama(1, max_position_embeddings=16)), 127, shift_logits=True)
    with pytest.raises(dk.errors.ContextLengthError, match="DiffusionDrafter has a context of 16 tokens"):
        dk.generate(target, [list(range(1, 13))], DiffusionDrafter(short), max_new_tokens=12)
    other = dk.dlm.DLMModel(dk.load_model(tiny_llama(1), words(range(127, -1, -1))), 127, shift_logits=True)
    with pytest.warns(UserWarning, match="maps 128 of the target's tokens to other ids"):
        dk.generate(target, [[1, 2, 3]], DiffusionDrafter(other), max_new_tokens=4)
    with pytest.raises(ConfigError, match="candidates='sampled' chooses a tree's nodes; without template="):
        DiffusionDrafter(other, candidates="sampled")
