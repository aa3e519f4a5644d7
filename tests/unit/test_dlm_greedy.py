"""dKV-Cache-Greedy and the rule it needs: random remasking in an order drawn once per block."""

from __future__ import annotations

import itertools

import pytest
import torch

import decodekit as dk
from decodekit.dlm import DLMState, Proposal
from decodekit.dlm.caches.dkv_greedy import window_slots
from decodekit.errors import ConfigError
from tests.unit.dlm_common import MASK, dense, peaked_llama
from tests.unit.spies import fed_positions
from tests.unit.stats import chi_square_pvalue

PROMPTS = [[5, 9, 14, 2], [33, 7], [1, 2, 3, 4, 5, 6, 7]]


@pytest.fixture(scope="module")
def hf():
    return peaked_llama()


def first_commits(rule, trials: int = 3000, biased: bool = False) -> torch.Tensor:
    """How often each pair of the 6 masked slots is a block's first step's commit (3 steps: 2 commits each)."""
    pairs = {p: i for i, p in enumerate(itertools.combinations(range(6), 2))}
    counts = torch.zeros(len(pairs))
    generator = torch.Generator().manual_seed(0)
    for _ in range(trials):
        state = DLMState.from_prompts([[1, 2]], 6, MASK, total_steps=3, generator=generator, device="cpu")
        state.block, state.block_steps = (0, 6), 3
        eligible = state.masked
        if hasattr(rule, "begin_block"):
            rule.begin_block(state)
        if biased:  # a random order that favours later slots: what a lopsided draw would give
            rule.rank = (torch.rand(1, 6, generator=generator) * torch.linspace(1, 3, 6)).argsort(1, True).argsort(1)
        commit = rule.select(state, Proposal(state.tokens, torch.zeros(1, 6), torch.zeros(1, 6, 1)), eligible)
        counts[pairs[tuple(commit[0].nonzero()[:, 0].tolist())]] += 1
    return counts


@pytest.mark.parametrize(("rule", "biased"), [("random_order", False), ("llada_random", False), ("random_order", True)])
def test_random_order_is_llada_random_remasking_in_distribution(rule, biased):
    """A block's first commits are a uniformly random pair of its 6 masked slots under both rules (chi-square, 15
    pairs); an order biased towards later slots fails the same test."""
    made = dk.dlm.RandomOrderRule() if rule == "random_order" else dk.dlm.LLaDARule("random")
    p = chi_square_pvalue(first_commits(made, biased=biased), torch.full((15,), 1 / 15))
    assert (p < 1e-4) if biased else (p > 1e-3)


def test_random_order_plans_each_step_and_covers_the_block_once():
    """Each step commits what the previous one planned; the steps' commits are disjoint and cover every masked slot
    of the block; after the last step nothing is planned."""
    state = DLMState.from_prompts(
        PROMPTS, 8, MASK, total_steps=4, generator=torch.Generator().manual_seed(1), device="cpu"
    )
    state.block, state.block_steps = (0, 8), 4
    rule, seen, planned = dk.dlm.RandomOrderRule(), torch.zeros(3, 8, dtype=torch.bool), None
    rule.begin_block(state)
    for step in range(4):
        state.step = step
        commit = rule.select(state, None, state.masked)
        assert commit.sum(1).tolist() == [2, 2, 2] and not (commit & seen).any()
        if planned is not None:
            assert torch.equal(commit, planned)
        planned, seen = state.planned, seen | commit
        state.commit(commit, torch.zeros(3, 8, dtype=torch.long))
    assert seen.all() and planned is None


def reference_window(due: list[int], masked: list[bool], size: int) -> set[int]:
    """The reference's scan for one due slot (left 1, right 1, left 2, ...), transcribed independently."""
    found: set[int] = set()
    for p in due:
        picked, d = [], 1
        while len(picked) < size and (p - d >= 0 or p + d < len(masked)):
            for j in (p - d, p + d):
                if 0 <= j < len(masked) and masked[j] and len(picked) < size:
                    picked.append(j)
            d += 1
        found |= set(picked)
    return found


@pytest.mark.parametrize(("due", "size"), [([5], 3), ([1], 4), ([2, 9], 2), ([0, 11], 5)])
def test_window_takes_the_nearest_masked_slots_left_first(due, size):
    masked = [j % 3 != 1 for j in range(12)]  # every third slot decoded
    due_mask = torch.zeros(1, 12, dtype=torch.bool)
    due_mask[0, due] = True
    candidates = torch.tensor([masked]) & ~due_mask
    got = set(window_slots(due_mask, candidates, size)[0].nonzero()[:, 0].tolist())
    assert got == reference_window(due, [m and j not in due for j, m in enumerate(masked)], size)


@pytest.mark.parametrize("shift", [False, True])
def test_dkv_greedy_feeds_due_slots_last_commits_and_their_window(hf, shift):
    """After a full step, a cached step feeds only the slot due now, the slot committed by the previous step and the
    window around the due slot (shifted: also the position before the due slot), at their true positions."""
    model = dk.dlm.load_model(hf, mask_token_id=MASK, shift_logits=shift)
    state = DLMState.from_prompts(PROMPTS, 8, MASK, total_steps=8, generator=None, device="cpu")
    state.block = (0, 8)
    cache = dk.dlm.DKVGreedyCache(refresh=100, window=2)
    with fed_positions(model, state) as fed:
        dense(cache.logits(model, state))  # step 0: the whole canvas
        state.commit(torch.arange(8)[None, :].expand(3, 8) == 2, torch.full((3, 8), 11))  # step 0 committed slot 2
        state.step, state.planned = 1, torch.arange(8)[None, :].expand(3, 8) == 5  # slot 5 is due at step 1
        dense(cache.logits(model, state))
    for row, prompt in enumerate(PROMPTS):
        want = {2, 4, 5, 6}  # the last commit, the due slot, its window of 2 (left, then right)
        assert fed[1][row] == sorted(len(prompt) + j for j in want | ({4} if shift else set()))


def test_dkv_greedy_refreshing_every_step_is_the_uncached_sampler(hf):
    """refresh=1 runs the whole canvas every step: the uncached RandomOrderRule sampler token for token; cached
    steps still fill every slot, and a row does not depend on its batch mates."""
    dlm = dk.dlm.load_model(hf, mask_token_id=MASK, shift_logits=True)
    kwargs = dict(gen_length=8, block_length=4, steps=8, temperature=0.8, rule=dk.dlm.RandomOrderRule())
    plain = dk.dlm.generate(dlm, PROMPTS, seed=[3, 1, 2], **kwargs).sequences
    exact = dk.dlm.generate(dlm, PROMPTS, seed=[3, 1, 2], cache=dk.dlm.DKVGreedyCache(refresh=1), **kwargs)
    assert exact.sequences == plain
    approx = dk.dlm.generate(dlm, PROMPTS, seed=[3, 1, 2], cache=dk.dlm.DKVGreedyCache(refresh=4), **kwargs)
    assert all(MASK not in row for row in approx.sequences)
    alone = dk.dlm.generate(dlm, PROMPTS[2:], seed=[2], cache=dk.dlm.DKVGreedyCache(refresh=4), **kwargs)
    assert alone.sequences[0] == approx.sequences[2]


def test_greedy_cache_and_planned_rule_refuse_what_they_cannot_work_with(hf):
    dlm = dk.dlm.load_model(hf, mask_token_id=MASK)
    with pytest.raises(ConfigError, match="RandomOrderRule"):
        dk.dlm.generate(dlm, PROMPTS, gen_length=8, block_length=4, steps=8, cache=dk.dlm.DKVGreedyCache())
    with pytest.raises(ConfigError, match="fixed blocks"):
        dk.dlm.generate(
            dlm,
            PROMPTS,
            gen_length=8,
            block_length=4,
            steps=8,
            rule=dk.dlm.RandomOrderRule(),
            schedule=dk.dlm.AdaBlock(),
        )
    with pytest.raises(ConfigError, match="window"):
        dk.dlm.DKVGreedyCache(window=-1)


@pytest.mark.parametrize("shift", [False, True])
def test_dkv_greedy_due_logits_equal_a_recompute_while_nothing_changed(hf, shift):
    """With no commit since the full step, every kept K/V is current, so the due slots' logits from the partial
    forward equal the whole canvas's (ragged rows; shifted, through the position before each due slot)."""
    model = dk.dlm.load_model(hf, mask_token_id=MASK, shift_logits=shift)
    state = DLMState.from_prompts(PROMPTS, 8, MASK, total_steps=8, generator=None, device="cpu")
    state.block, cache = (0, 8), dk.dlm.DKVGreedyCache(refresh=100, window=1)
    dense(cache.logits(model, state))
    state.step, state.planned = 1, torch.tensor([[j in (1, 6) for j in range(8)]] * 3)
    got, want = dense(cache.logits(model, state)), dk.dlm.Recompute().logits(model, state)
    torch.testing.assert_close(got[:, [1, 6]], want[:, [1, 6]], atol=1e-5, rtol=1e-5)
