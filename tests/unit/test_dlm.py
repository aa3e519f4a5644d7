"""The diffusion sampler: LLaDA parity at temperature 0, Gumbel sampling in distribution, batch independence, rules."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import decodekit as dk
from decodekit.dlm import DLMState, Proposal
from decodekit.dlm.rules.common import transfer_counts
from decodekit.errors import ConfigError, ContextLengthError, NoProgressError
from decodekit.models.tiny import tiny_llama
from tests.unit.dlm_common import MASK, dense, peaked_llama
from tests.unit.spies import fed_positions, forward_widths
from tests.unit.stats import chi_square_pvalue, total_variation, tv_noise


@pytest.fixture(scope="module")
def hf():
    return peaked_llama()


@pytest.fixture(scope="module")
def dlm(hf):
    return dk.dlm.load_model(hf, mask_token_id=MASK)


def reference_llada(hf, prompt, gen_length, block_length, steps, cfg_scale=0.0):
    """An independent transcription of ML-GSAI/LLaDA ``generate.py`` at temperature 0 (low-confidence remasking),
    one row, the whole sequence every step, the model called directly with an all-True 4-D mask."""
    x = torch.full((1, len(prompt) + gen_length), MASK, dtype=torch.long)
    x[0, : len(prompt)] = torch.tensor(prompt)
    prompt_index = x != MASK
    num_blocks = gen_length // block_length
    per_block = steps // num_blocks

    def model_logits(ids):
        full = torch.ones(ids.shape[0], 1, ids.shape[1], ids.shape[1], dtype=torch.bool)
        return hf(input_ids=ids, attention_mask=full).logits

    for nb in range(num_blocks):
        lo, hi = len(prompt) + nb * block_length, len(prompt) + (nb + 1) * block_length
        masked_in_block = (x[:, lo:hi] == MASK).sum(1, keepdim=True)
        base, rest = masked_in_block // per_block, masked_in_block % per_block
        counts = torch.zeros(1, per_block, dtype=torch.long) + base
        counts[0, : int(rest)] += 1
        for i in range(per_block):
            mask_index = x == MASK
            if cfg_scale > 0:
                un = x.clone()
                un[prompt_index] = MASK
                logits = model_logits(torch.cat([x, un]))
                cond, uncond = logits.chunk(2)
                logits = uncond + (cfg_scale + 1) * (cond - uncond)
            else:
                logits = model_logits(x)
            x0 = logits.argmax(-1)
            x0_p = F.softmax(logits, dim=-1).gather(-1, x0[..., None])[..., 0]
            x0_p[:, hi:] = -float("inf")
            x0 = torch.where(mask_index, x0, x)
            confidence = torch.where(mask_index, x0_p, torch.tensor(-float("inf")))
            _, idx = torch.topk(confidence[0], k=int(counts[0, i]))
            x[0, idx] = x0[0, idx]
    return x[0, len(prompt) :].tolist()


PROMPTS = [[5, 9, 14, 2], [33, 7], [1, 2, 3, 4, 5, 6, 7]]


@pytest.mark.parametrize(
    ("gen", "block", "steps", "cfg"), [(8, 4, 8, 0.0), (8, 8, 4, 0.0), (10, 5, 6, 0.0), (7, 7, 3, 1.5)]
)
def test_greedy_equals_the_reference_loop(hf, dlm, gen, block, steps, cfg):
    """Token for token the reference sampler's output, for each row of a ragged batch (1, 2 or 3 commits a step)."""
    out = dk.dlm.generate(dlm, PROMPTS, gen_length=gen, block_length=block, steps=steps, cfg_scale=cfg)
    for row, prompt in zip(out.sequences, PROMPTS):
        assert row == reference_llada(hf, prompt, gen, block, steps, cfg)
        assert MASK not in row
    assert out.stats.nfe == steps and out.stats.block_steps == [steps // (gen // block)] * (gen // block)
    assert out.stats.tokens_per_forward == pytest.approx(gen / steps)


@pytest.mark.parametrize("rule", ["llada", "threshold", "factor", "local_leap", "prophet"])
def test_a_row_does_not_depend_on_its_batch_mates(dlm, rule):
    """Each row alone (seeded per row, sampled) equals the same row in a ragged batch: padding and batch mates
    change neither its positions nor its randomness."""
    kwargs = dict(gen_length=8, block_length=4, steps=8, temperature=0.8, rule=dk.build("dlm_rule", rule))
    batch = dk.dlm.generate(dlm, PROMPTS, seed=[11, 12, 13], **kwargs).sequences
    for b, prompt in enumerate(PROMPTS):
        assert dk.dlm.generate(dlm, [prompt], seed=[11 + b], **kwargs).sequences[0] == batch[b]


def test_sampling_is_softmax_at_temperature(hf):
    """One slot, one step: the committed token follows softmax(logits / T) (float64 Gumbel-max); the same test
    detects a sampler that ignores the temperature."""
    model = dk.dlm.load_model(tiny_llama(4, vocab=17, init=0.3), mask_token_id=16)
    prompt, n, temperature = [3, 7, 1], 6000, 0.6
    canvas = torch.tensor([prompt + [16]])
    logits = model.lm.hf(input_ids=canvas, attention_mask=torch.ones(1, 1, 4, 4, dtype=torch.bool)).logits[0, -1]
    probs = (logits.double() / temperature).softmax(-1)

    def counts(temp: float) -> torch.Tensor:
        out = dk.dlm.generate(
            model, [prompt] * n, gen_length=1, block_length=1, steps=1, temperature=temp, seed=list(range(n))
        )
        return torch.bincount(torch.tensor([s[0] for s in out.sequences]), minlength=17)

    good = counts(temperature)
    assert chi_square_pvalue(good, probs) > 1e-4 and total_variation(good, probs) < 3 * tv_noise(probs, n)
    biased = counts(1.0)  # the wrong temperature
    assert chi_square_pvalue(biased, probs) < 1e-8


def synthetic(confidence: list[list[float]], eligible: list[list[bool]] | None = None, gaps=None) -> tuple:
    conf = torch.tensor(confidence)
    b, g = conf.shape
    state = DLMState.from_prompts([[1]] * b, g, MASK, total_steps=4, generator=None, device="cpu")
    state.block, state.block_steps = (0, g), 4
    logits = torch.zeros(b, g, 3)
    if gaps is not None:
        logits[..., 0] = torch.tensor(gaps)
    elig = torch.ones(b, g, dtype=torch.bool) if eligible is None else torch.tensor(eligible)
    return state, Proposal(torch.zeros(b, g, dtype=torch.long), conf, logits), elig


def test_transfer_counts_front_load_the_remainder():
    assert transfer_counts(torch.tensor([10, 3, 0]), 4).tolist() == [[3, 3, 2, 2], [1, 1, 1, 0], [0, 0, 0, 0]]


def test_threshold_commits_the_sure_slots_and_the_top_one():
    state, prop, elig = synthetic([[0.95, 0.2, 0.9, 0.5], [0.3, 0.4, 0.1, 0.2]], [[True, True, True, False]] * 2)
    got = dk.dlm.ThresholdRule(0.9).select(state, prop, elig)
    assert got.tolist() == [[True, False, True, False], [False, True, False, False]]


def test_factor_takes_the_longest_passing_prefix():
    # sorted: 0.99 (j=1 always), 0.8 >= 1 - 1/3, 0.7 < 1 - 1/4: two commits
    state, prop, elig = synthetic([[0.7, 0.99, 0.1, 0.8]])
    assert dk.dlm.FactorRule(1.0).select(state, prop, elig).tolist() == [[False, True, False, True]]
    # every rank passes up to the last one, which fails: the reference code's quirk would take all four
    state, prop, elig = synthetic([[0.99, 0.9, 0.85, 0.1]])
    assert dk.dlm.FactorRule(1.0).select(state, prop, elig).tolist() == [[True, True, True, False]]


def test_local_leap_relaxes_only_near_anchors():
    state, prop, elig = synthetic([[0.95, 0.8, 0.2, 0.2, 0.2, 0.8, 0.1]])
    got = dk.dlm.LocalLeapRule(0.9, 0.75, radius=1).select(state, prop, elig)
    assert got.tolist() == [[True, True, False, False, False, False, False]]  # slot 5 is 0.8 but far from the anchor


def test_prophet_fills_every_masked_slot_once_sure():
    rule = dk.dlm.ProphetRule(base=dk.dlm.ThresholdRule(0.99))
    state, prop, elig = synthetic(
        [[0.5, 0.6, 0.4, 0.3]] * 2, [[True, True, False, False]] * 2, gaps=[[8.0] * 4, [4.0] * 4]
    )
    got = rule.select(state, prop, elig)  # progress 1/4 (step 0 counts): needs 7.5; row 0 fills all, later blocks too
    assert got.tolist() == [[True] * 4, [False, True, False, False]]
    state.row_steps = [0, 3]  # row 1's progress 4/4: 2.5 suffices (each row's own steps count)
    assert rule.select(state, prop, elig).all()
    state.row_steps = [3, 0]  # row 1 at its first step again: 7.5 needed, whatever row 0 has taken
    assert rule.select(state, prop, elig).tolist() == [[True] * 4, [False, True, False, False]]


def test_prophet_never_fills_slots_no_forward_predicted(hf):
    """Under the block-causal cache, which predicts only the current block, Prophet's all-in commit fills that
    block and decoding goes on: with thresholds 0 it equals LLaDA committing each block in one step under the same
    cache. Filling later blocks, which have no proposal (the bug this catches), ends the call after one forward."""
    sure = dk.dlm.ProphetRule(thresholds=(0.0, 0.0, 0.0))
    kwargs = dict(gen_length=12, block_length=4, temperature=0.0)
    model = dk.dlm.load_model(hf, mask_token_id=MASK, block_length=4)
    got = dk.dlm.generate(model, PROMPTS, steps=12, rule=sure, cache=dk.dlm.BlockCausalCache(), **kwargs)
    want = dk.dlm.generate(model, PROMPTS, steps=3, cache=dk.dlm.BlockCausalCache(), **kwargs)
    assert got.sequences == want.sequences and got.stats.nfe == 3
    state, prop, elig = synthetic([[0.5] * 4], [[True, True, False, False]], gaps=[[9.0, 9.0, 0.0, 0.0]])
    assert sure.select(state, prop, elig).tolist() == [[True, True, False, False]]  # slots 2, 3: all-zero logits


def test_a_rule_that_commits_nothing_is_refused(dlm):
    class Idle:
        def select(self, state, proposal, eligible):
            return torch.zeros_like(eligible)

    with pytest.raises(NoProgressError, match="Idle.select committed nothing"):
        dk.dlm.generate(dlm, [[1, 2]], gen_length=4, block_length=4, steps=4, rule=Idle())


def test_bad_arguments_fail_early(hf, dlm):
    with pytest.raises(ConfigError, match="mask_token_id"):
        dk.dlm.load_model(hf)
    with pytest.raises(ConfigError, match="inside the vocabulary"):
        dk.dlm.load_model(hf, mask_token_id=128)
    with pytest.raises(ConfigError, match="dk.dlm.load_model"):
        dk.dlm.generate(hf, [[1]], gen_length=4, block_length=4, steps=4)
    with pytest.raises(ConfigError, match="must divide gen_length"):
        dk.dlm.generate(dlm, [[1]], gen_length=6, block_length=4, steps=4)
    with pytest.raises(ConfigError, match="multiple of the number of blocks"):
        dk.dlm.generate(dlm, [[1]], gen_length=8, block_length=4, steps=5)
    with pytest.raises(ConfigError, match="cache strategy"):
        dk.dlm.generate(dlm, [[1]], gen_length=4, block_length=4, steps=4, cache="dual")
    with pytest.raises(ConfigError, match="guidance"):
        dk.dlm.generate(dlm, [[1]], gen_length=4, block_length=4, steps=4, cfg_scale=1.0, cache=dk.dlm.PrefixCache())
    with pytest.raises(ConfigError, match="remasking"):
        dk.dlm.generate(dlm, [[1]], gen_length=4, block_length=4, steps=4, remasking="lowest")
    with pytest.raises(ContextLengthError, match="gen_length"):
        dk.dlm.generate(dlm, [[1] * 200], gen_length=64, block_length=64, steps=64)
    with pytest.raises(ConfigError, match="empty"):
        dk.dlm.generate(dlm, [[]], gen_length=4, block_length=4, steps=4)


def test_shifted_logits_read_the_previous_position(hf):
    """shift_logits: slot j's logits are the output at canvas position j - 1 (AR-initialised models)."""
    plain, shifted = (dk.dlm.load_model(hf, mask_token_id=MASK, shift_logits=s) for s in (False, True))
    canvas = torch.tensor([[5, 9, 14, MASK, MASK, MASK]])
    lengths, starts = torch.tensor([6]), torch.tensor([3])
    full = hf(input_ids=canvas, attention_mask=torch.ones(1, 1, 6, 6, dtype=torch.bool)).logits
    torch.testing.assert_close(plain.forward(canvas, lengths, starts, 3)[0], full[:, 3:], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(shifted.forward(canvas, lengths, starts, 3)[0], full[:, 2:5], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", ["prefix", "dual"])
@pytest.mark.parametrize("shift", [False, True])
def test_cached_step_equals_recompute_while_nothing_changed(hf, name, shift):
    """A cache strategy's later step reads K/V kept from the block's first step: with no commit in between, those
    K/V are current, so the step's logits equal a recompute (ragged rows, second block, shifted or not)."""
    model = dk.dlm.load_model(hf, mask_token_id=MASK, shift_logits=shift)
    state = DLMState.from_prompts(PROMPTS, 8, MASK, total_steps=4, generator=None, device="cpu")
    state.commit(torch.ones(3, 8, dtype=torch.bool) & (torch.arange(8) < 4), torch.randint(0, 100, (3, 8)))
    state.block, state.step = (4, 8), 0
    cache = dk.build("dlm_cache", name)
    first = dense(cache.logits(model, state))
    state.step = 1
    again = dense(cache.logits(model, state))
    reference = dk.dlm.Recompute().logits(model, state)
    torch.testing.assert_close(first, reference)
    torch.testing.assert_close(again[:, 4:], reference[:, 4:], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("shift", [False, True])
def test_dkv_feeds_each_token_one_step_after_it_is_decoded(hf, shift):
    """dKV-Cache-Decode: after the two full steps, a step recomputes exactly the positions undecoded at the previous
    step's input (plus, shifted, the position before each); with no commit in between its logits equal a recompute."""
    model = dk.dlm.load_model(hf, mask_token_id=MASK, shift_logits=shift)
    state = DLMState.from_prompts(PROMPTS, 8, MASK, total_steps=8, generator=None, device="cpu")
    state.block = (0, 4)
    cache = dk.build("dlm_cache", "dkv", refresh=100)
    with fed_positions(model, state) as fed:
        for step in range(5):
            state.step = step
            logits = dense(cache.logits(model, state))
            if step == 2:  # nothing committed since the full step 1: the cached K/V are current
                want = dk.dlm.Recompute().logits(model, state)
                torch.testing.assert_close(logits[:, 1:], want[:, 1:], atol=1e-5, rtol=1e-5)
            if step in (0, 2):  # commit slot 0 after step 0, slot 1 after step 2
                state.commit(torch.arange(8)[None, :].expand(3, 8) == step // 2, logits.argmax(-1))
    for row, prompt in enumerate(PROMPTS):
        start, length = len(prompt), len(prompt) + 8
        assert fed[3][row] == list(range(start + 1 - shift, length))  # slot 1: fed once more after its commit
        assert fed[4][row] == list(range(start + 2 - shift, length))  # then read from the cache


def test_dkv_refreshing_every_step_is_the_uncached_sampler(dlm):
    """refresh=1: every step runs the whole canvas, so the call is the uncached one token for token; with a longer
    interval (cached steps) the call still fills every slot."""
    kwargs = dict(gen_length=8, block_length=4, steps=8, temperature=0.8, seed=[3, 1, 2])
    exact = dk.dlm.generate(dlm, PROMPTS, cache=dk.dlm.DKVCache(refresh=1), **kwargs)
    assert exact.sequences == dk.dlm.generate(dlm, PROMPTS, **kwargs).sequences
    approx = dk.dlm.generate(dlm, PROMPTS, cache=dk.dlm.DKVCache(refresh=3), **kwargs)
    assert all(MASK not in row for row in approx.sequences)


def test_eot_stop_fills_the_tail_after_a_committed_end_of_text(dlm):
    """EoTStop: a slot committed as end-of-text (this step or earlier) turns every later masked slot into
    end-of-text at once, in later blocks too, so they cost no forward; slots before it decode as usual."""
    state = DLMState.from_prompts(PROMPTS[:2], 8, MASK, total_steps=8, generator=None, device="cpu")
    state.block = (0, 4)
    state.commit(torch.tensor([[False] * 8, [False, False, False, True] + [False] * 4]), torch.full((2, 8), 50))
    tokens = torch.tensor([[7, 50, 8, 9, 10, 11, 12, 13], [7] * 8])
    proposal = Proposal(tokens, torch.ones(2, 8), torch.zeros(2, 8, 128))
    pick_slot_1 = type("Pick", (), {"select": lambda self, st, pr, el: torch.arange(8).expand(2, 8) == 1})()
    commit = dk.dlm.EoTStop(pick_slot_1, eot_token_ids=[50, 51]).select(state, proposal, state.masked & state.in_block)
    assert commit.tolist() == [[False, True] + [True] * 6, [False, True, False, False] + [True] * 4]
    assert proposal.tokens.tolist() == [[7, 50] + [50] * 6, [7] * 4 + [50] * 4]

    kwargs = dict(gen_length=8, block_length=2, steps=8)
    base = dk.dlm.generate(dlm, PROMPTS, **kwargs)
    eot = base.sequences[0][1]  # call row 0's second token "end of text"
    out = dk.dlm.generate(dlm, PROMPTS, rule=dk.dlm.EoTStop(eot_token_ids=eot), **kwargs)
    for row in out.sequences:
        assert eot not in row or all(t == eot for t in row[row.index(eot) :])
    assert eot in out.sequences[0] and out.stats.row_nfe[0] <= 2 < base.stats.row_nfe[0] == 8  # one block, not four
    with pytest.raises(ConfigError, match="end-of-sequence"):
        dk.dlm.generate(dlm, PROMPTS, rule=dk.dlm.EoTStop(), **kwargs)


@pytest.mark.parametrize("name", ["prefix", "dual", "dkv"])
def test_cached_sampling_fills_the_canvas_and_refreshes_per_block(dlm, name):
    """A whole call with a cache: no mask left, one refresh per block counted in the forwards, rows independent of
    their batch mates; one step per block means every step is a refresh, so the output is the uncached one."""
    kwargs = dict(gen_length=8, block_length=4, steps=8, rule=dk.dlm.ThresholdRule(0.5))
    out = dk.dlm.generate(dlm, PROMPTS, cache=dk.build("dlm_cache", name), seed=[1, 2, 3], temperature=0.7, **kwargs)
    assert all(MASK not in row for row in out.sequences) and out.stats.nfe == sum(out.stats.block_steps)
    alone = dk.dlm.generate(dlm, PROMPTS[1:2], cache=dk.build("dlm_cache", name), seed=[2], temperature=0.7, **kwargs)
    assert alone.sequences[0] == out.sequences[1]
    one_step = dict(gen_length=8, block_length=4, steps=2)
    cached = dk.dlm.generate(dlm, PROMPTS, cache=dk.build("dlm_cache", name), **one_step)
    assert cached.sequences == dk.dlm.generate(dlm, PROMPTS, **one_step).sequences


@pytest.mark.parametrize("shift", [False, True])
@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_block_causal_cache_equals_block_causal_recompute(hf, shift, temperature):
    """Block-causal decoding: the cached run (prompt and finished blocks stored once, the block run against them)
    gives exactly the uncached block-causal run's tokens, on ragged rows, in one forward a step: each finished block
    is stored by the next step's forward, not by one of its own."""
    model = dk.dlm.load_model(hf, mask_token_id=MASK, shift_logits=shift)
    kwargs = dict(gen_length=12, block_length=4, steps=6, temperature=temperature, seed=[4, 5, 6])
    with forward_widths(model) as widths:
        cached = dk.dlm.generate(model, PROMPTS, cache=dk.dlm.BlockCausalCache(), **kwargs)
    full = dk.dlm.generate(model, PROMPTS, cache=dk.dlm.Recompute(block_causal=True), **kwargs)
    assert cached.sequences == full.sequences
    assert len(widths) == cached.stats.nfe == 6 and cached.stats.cache_forwards == 0
    longest = max(map(len, PROMPTS))
    assert widths == [longest + 4, 4, 4 + 4, 4, 4 + 4, 4]  # the prompt, then each finished block, rides along
    bidirectional = dk.dlm.generate(model, PROMPTS, **kwargs).sequences
    assert bidirectional != full.sequences  # the mask matters: the test would notice a cache that ignored it


def test_a_cache_strategys_own_forwards_are_reported_apart(dlm):
    """A strategy's optional ``forwards`` count (forwards besides the steps') reaches ``stats.cache_forwards``, read
    after the call, and stays out of ``nfe``."""

    class Extra(dk.dlm.Recompute):
        forwards = 0

        def logits(self, dlm, state):
            if state.step == 0:  # a block's first step: pretend to run a forward of its own
                self.forwards += 1
            return super().logits(dlm, state)

    out = dk.dlm.generate(dlm, PROMPTS, gen_length=8, block_length=4, steps=4, cache=Extra())
    assert out.stats.cache_forwards == 2 and out.stats.nfe == 4


@pytest.mark.parametrize("shift", [False, True])
def test_block_causal_logits_match_at_every_step(hf, shift):
    """Step by step, the cached block's logits equal the block-causal recompute's, after commits too."""
    state = DLMState.from_prompts(PROMPTS, 8, MASK, total_steps=4, generator=None, device="cpu")
    state.block_length = 4
    cache, reference = dk.dlm.BlockCausalCache(), dk.dlm.Recompute(block_causal=True)
    model = dk.dlm.load_model(hf, mask_token_id=MASK, shift_logits=shift)
    cache.begin(state)
    for lo in (0, 4):
        state.block = (lo, lo + 4)
        for step in range(2):
            state.step = step
            got, want = dense(cache.logits(model, state)), dense(reference.logits(model, state))
            torch.testing.assert_close(got[:, lo : lo + 4], want[:, lo : lo + 4], atol=1e-4, rtol=1e-4)
            slots = torch.zeros(3, 8, dtype=torch.bool)
            slots[:, lo + 2 * step : lo + 2 * step + 2] = True
            state.commit(slots, want.argmax(-1))


@pytest.mark.parametrize("kind", ["dlm_rule", "dlm_cache", "dlm_schedule", "dlm_draft"])
def test_every_rule_cache_and_schedule_has_a_recipe_that_builds_it(kind):
    """One recipe per registered rule, cache and schedule, named as registered, instantiating the registered class."""
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    from decodekit.cli import RECIPES
    from decodekit.registry import available

    recipes = {p.stem: p for p in (RECIPES / kind).glob("*.yaml")}
    assert set(recipes) == set(available(kind))
    for name, path in recipes.items():
        built = instantiate(OmegaConf.load(path))
        assert type(built) is type(dk.build(kind, name)), name


def test_adablock_ends_each_rows_block_at_its_confident_delimiter(dlm):
    """AdaBlock's first step of a block: a row whose most confident predicted delimiter in the window reaches the
    threshold ends its block there (inclusive); another row falls back to block_length; the next block starts
    where each row's ended."""
    state = DLMState.from_prompts(PROMPTS[:2], 8, MASK, total_steps=8, generator=None, device="cpu")
    state.block_length = 4
    schedule = dk.dlm.AdaBlock(delimiters=[9], threshold=0.5, window=0.5)
    rounds = schedule.rounds(dlm, state)
    next(rounds)
    tokens = torch.tensor([[1, 9, 9, 2, 2, 9, 2, 2], [9, 2, 2, 2, 2, 2, 9, 2]])
    confidence = torch.tensor([[0.9, 0.4, 0.7, 0.9, 0.9, 0.95, 0.9, 0.9], [0.3] * 8])
    region = schedule.region(state, Proposal(tokens, confidence, torch.zeros(2, 8, 128)))
    assert region.long().tolist() == [[1, 1, 1, 0, 0, 0, 0, 0], [1, 1, 1, 1, 0, 0, 0, 0]]  # slot 5 is past the window
    state.commit(region, tokens)
    next(rounds)
    assert state.region.long().tolist() == [[0, 0, 0, 1, 1, 1, 1, 1], [0, 0, 0, 0, 1, 1, 1, 1]]


def test_adaptive_schedules_fill_every_slot_rows_alone_or_batched(dlm):
    """AdaBlock and DCD calls: no mask left, a row's tokens independent of its batch mates (rows cut their own
    blocks); AdaBlock that never trusts a delimiter is the fixed schedule; DCD with a one-slot window decodes left
    to right, one slot per step."""
    kwargs = dict(gen_length=8, block_length=4, steps=8, rule=dk.dlm.ThresholdRule(0.3), temperature=0.8)
    for schedule in (dk.dlm.AdaBlock(delimiters=[5, 9], threshold=0.0), dk.dlm.DeferredWindow(size=3, max_masked=2)):
        out = dk.dlm.generate(dlm, PROMPTS, schedule=schedule, seed=[1, 2, 3], **kwargs)
        assert all(MASK not in row for row in out.sequences)
        alone = dk.dlm.generate(dlm, PROMPTS[2:], schedule=schedule, seed=[3], **kwargs)
        assert alone.sequences[0] == out.sequences[2]
    never = dk.dlm.AdaBlock(delimiters=[5], threshold=1.01)
    fixed = dk.dlm.generate(dlm, PROMPTS, seed=[1, 2, 3], **kwargs)
    assert dk.dlm.generate(dlm, PROMPTS, schedule=never, seed=[1, 2, 3], **kwargs).sequences == fixed.sequences
    one = dk.dlm.generate(dlm, PROMPTS, schedule=dk.dlm.DeferredWindow(size=1), **kwargs)
    assert one.stats.nfe == 8 and one.stats.block_steps == [8]  # the window slides on: one round
    for threshold in (0.5, 0.7):  # a row whose window empties slides on at once, batched or alone
        rule = dk.dlm.ThresholdRule(threshold)
        both = dict(kwargs, rule=rule, schedule=dk.dlm.DeferredWindow(size=3))
        out = dk.dlm.generate(dlm, PROMPTS, seed=[1, 2, 3], **both)
        alone = [dk.dlm.generate(dlm, [p], seed=[s], **both) for p, s in zip(PROMPTS, [1, 2, 3])]
        assert [a.sequences[0] for a in alone] == out.sequences
        assert [a.stats.row_nfe[0] for a in alone] == out.stats.row_nfe
    with pytest.raises(ConfigError, match="same blocks in every row"):
        schedule = dk.dlm.AdaBlock(delimiters=[5])
        dk.dlm.generate(dlm, PROMPTS, schedule=schedule, cache=dk.dlm.BlockCausalCache(), **kwargs)


@pytest.mark.parametrize("name", ["prefix", "dual"])
@pytest.mark.parametrize("shift", [False, True])
def test_adaptive_cached_step_feeds_its_span_and_equals_recompute_while_nothing_changed(hf, name, shift):
    """Under an adaptive schedule (``state.region``, ragged per row) a later step feeds each row's positions from the
    first slot masked at the round's first step on (prefix: to the end; dual: to the region's end); with no commit
    in between its logits there equal a recompute."""
    model = dk.dlm.load_model(hf, mask_token_id=MASK, shift_logits=shift)
    state = DLMState.from_prompts(PROMPTS, 8, MASK, total_steps=4, generator=None, device="cpu")
    j = torch.arange(8)
    state.commit((j < torch.tensor([[2], [3], [1]])), torch.randint(0, 100, (3, 8)))
    state.region = (j >= torch.tensor([[2], [3], [1]])) & (j < torch.tensor([[5], [8], [4]]))
    cache = dk.build("dlm_cache", name)
    state.step = 0
    dense(cache.logits(model, state))
    state.step = 1
    with fed_positions(model, state) as fed:
        again = dense(cache.logits(model, state))
    reference = dk.dlm.Recompute().logits(model, state)
    for row, (prompt, lo, hi) in enumerate(zip(PROMPTS, (2, 3, 1), (5, 8, 4))):
        hi = 8 if name == "prefix" else hi
        start = len(prompt)
        assert fed[1][row] == [p for p in range(start + lo - shift, start + hi - shift) if p > 0]
        torch.testing.assert_close(again[row, lo:hi], reference[row, lo:hi], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", ["prefix", "dual"])
def test_prefix_and_dual_caches_run_under_adaptive_schedules(dlm, name):
    """AdaBlock that never trusts a delimiter cuts the fixed blocks, and the caches' adaptive form then gives their
    fixed form's tokens; under AdaBlock and DCD's sliding window (with and without a refresh interval) every slot is
    filled and a row's tokens do not depend on its batch mates; refreshing every step is the uncached sampler."""
    kwargs = dict(gen_length=8, block_length=4, steps=8, rule=dk.dlm.ThresholdRule(0.5), temperature=0.7)
    never = dk.dlm.AdaBlock(delimiters=[5], threshold=1.01)

    def run(prompts, seeds, schedule=None, **cache_args):
        cache = dk.build("dlm_cache", name, **cache_args)
        return dk.dlm.generate(dlm, prompts, cache=cache, schedule=schedule, seed=seeds, **kwargs).sequences

    assert run(PROMPTS, [1, 2, 3], never) == run(PROMPTS, [1, 2, 3])
    dcd = dk.dlm.DeferredWindow(size=3)
    for schedule, refresh in ((dk.dlm.AdaBlock(delimiters=[5, 9], threshold=0.0), None), (dcd, None), (dcd, 2)):
        out = run(PROMPTS, [1, 2, 3], schedule, refresh=refresh)
        assert all(MASK not in row for row in out)
        assert run(PROMPTS[2:], [3], schedule, refresh=refresh)[0] == out[2]
    uncached = dk.dlm.generate(dlm, PROMPTS, schedule=dcd, seed=[1, 2, 3], **kwargs).sequences
    assert run(PROMPTS, [1, 2, 3], dcd, refresh=1) == uncached
    assert run(PROMPTS, [1, 2, 3], refresh=1) == dk.dlm.generate(dlm, PROMPTS, seed=[1, 2, 3], **kwargs).sequences


def test_dcd_window_starts_at_the_leftmost_mask_and_caps_its_masks():
    """DCD's region: from each row's leftmost masked slot, at most ``size`` slots and ``max_masked`` masked ones."""
    state = DLMState.from_prompts(PROMPTS[:2], 8, MASK, total_steps=8, generator=None, device="cpu")
    state.block_length = 4
    done = torch.tensor([[1, 1, 0, 1, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0, 0, 0]], dtype=torch.bool)
    state.commit(done, torch.full((2, 8), 3))
    region = dk.dlm.DeferredWindow(size=5, max_masked=2).region(state, None)
    assert region.long().tolist() == [[0, 0, 1, 1, 1, 0, 0, 0], [1, 1, 0, 0, 0, 0, 0, 0]]


@pytest.mark.parametrize("task", ["copy", "reverse", "sort", "join"])
def test_synthetic_items_are_true_python_and_scored_on_the_first_line(task):
    """Every few-shot line and every answer is a true Python statement (the tasks' answers are known exactly);
    the score reads the completion's first line only."""
    from decodekit.dlm.synthetic import correct, make_items

    items = make_items(task, 5, seed=1)
    assert len({i.prompt for i in items}) == 5 and items == make_items(task, 5, seed=1)
    env = {"copy": list, "reverse": lambda xs: xs[::-1]}
    for item in items:
        for line in (item.prompt + " " + item.answer).split("\n"):
            assert eval(line, env) is True, line  # noqa: S307 (our own generated lines)
        assert correct(item, f" {item.answer}\nanything after") and not correct(item, item.answer[:-1] + "9]")
    with pytest.raises(ValueError, match="unknown synthetic task"):
        make_items("spell", 1)


class _Template:
    """A tokenizer stand-in with a chat template: turns as ``<role>content`` lines, then ``<assistant>``."""

    chat_template = "test"

    def apply_chat_template(self, turns, tokenize=False, add_generation_prompt=False):
        return "".join(f"<{t['role']}>{t['content']}\n" for t in turns) + (
            "<assistant>" if add_generation_prompt else ""
        )


@pytest.mark.parametrize("task", ["copy", "reverse", "sort", "join"])
def test_synthetic_items_as_chat_turns_ask_the_same_cases(task):
    """``style="chat"``: each shot is a user request holding the case's input and the assistant's bare answer; the
    question and its answer are the lines style's, so the two styles score the same cases."""
    from decodekit.dlm.synthetic import make_items

    lines, chat = make_items(task, 3, seed=2), make_items(task, 3, seed=2, style="chat", tokenizer=_Template())
    assert [i.answer for i in chat] == [i.answer for i in lines]
    for a, b in zip(lines, chat):
        shots = a.prompt.split("\n")
        turns = b.prompt.split("\n")
        assert len(turns) == 2 * len(shots) and turns[-1] == "<assistant>"
        for shot, user, assistant in zip(shots[:-1], turns[0::2], turns[1::2]):
            question, answer = shot.split(" == ")
            given = question[question.index("[") : question.rindex("]") + 1]
            assert user.startswith("<user>") and user.endswith(given) and assistant == f"<assistant>{answer}"
        assert turns[-2].endswith(shots[-1][shots[-1].index("[") : shots[-1].rindex("]") + 1])  # no answer given
    with pytest.raises(ValueError, match="chat template"):
        make_items(task, 1, style="chat")
    with pytest.raises(ValueError, match="unknown synthetic style"):
        make_items(task, 1, style="prose")


def test_dlm_bench_refuses_an_unknown_synthetic_style_before_loading(tmp_path):
    from decodekit.bench.dlm import run

    with pytest.raises(ConfigError, match="synthetic_style"):
        run(tmp_path, model="no-such-model", synthetic_style="prose")


def test_dlm_bench_refuses_unknown_kernels_before_loading(tmp_path):
    from decodekit.bench.dlm import run

    with pytest.raises(ConfigError, match="unknown kernels"):
        run(tmp_path, model="no-such-model", kernels="mkl")
    with pytest.raises(ConfigError, match="device must be a device"):  # read to choose the kernels: checked first
        run(tmp_path, model="no-such-model", device="gpu", kernels="onednn")


def test_onednn_kernels_give_the_sampler_its_tokens():
    """A diffusion LM on prepacked oneDNN linears (what dlm-bench runs on a CPU) samples the tokens of the stock
    model: blocks, caches and drafts go through the same linears."""
    hf = peaked_llama()
    stock = dk.dlm.load_model(hf, mask_token_id=MASK)
    packed = dk.dlm.load_model(hf, mask_token_id=MASK, kernels="onednn")
    assert packed.lm.hf is not stock.lm.hf  # a converted copy: the caller's model keeps its linears
    settings = dict(gen_length=12, block_length=6, steps=12, seed=[4, 5])
    for cache, draft in [(None, None), (dk.dlm.BlockCausalCache(), dk.dlm.SpiffyDrafts())]:
        runs = [
            dk.dlm.generate(m, [[5, 9, 14, 2], [33, 7]], cache=cache, draft=draft, **settings) for m in (stock, packed)
        ]
        assert runs[0].sequences == runs[1].sequences and runs[0].stats.nfe == runs[1].stats.nfe


def test_dlm_bench_refuses_an_uncached_reference_to_a_disabled_method(tmp_path):
    """Found before any model loads or any call runs (a disabled reference once failed a 24-minute run at the end)."""
    from decodekit.bench.dlm import run

    methods = {"cached": {"rule": None, "cache": dk.dlm.DKVCache(), "uncached": "threshold"}, "threshold": None}
    with pytest.raises(ConfigError, match="not an enabled method"):
        run(tmp_path, model="no-such-model", methods=methods)
    with pytest.raises(ConfigError, match=r"only names \['threshold'\]"):
        run(tmp_path, model="no-such-model", methods=methods, only=["cached", "threshold"])


@pytest.mark.parametrize(
    "experiment",
    [None, "bdlm_g256", "bdlm_synthetic_chat", "bdlm_spiffy", "bdlm_spiffy_calibrated", "bdlm_spiffy_pruned",
     "dcd_caches"],
)  # fmt: skip
def test_dlm_bench_experiments_compose_and_build(experiment):
    """The dlm-bench recipe and each of its experiments compose, build every method and the base, and every
    ``uncached`` reference names an enabled method (the check ``run`` makes before loading a model)."""
    from hydra import compose, initialize_config_dir
    from hydra.utils import instantiate

    from decodekit.cli import RECIPES

    overrides = [] if experiment is None else [f"experiment={experiment}"]
    with initialize_config_dir(str(RECIPES / "dlm_bench"), version_base="1.3"):
        cfg = compose("dlm_bench", overrides=overrides)
    methods = {k: v for k, v in instantiate(cfg.methods, _convert_="all").items() if v is not None}
    if cfg.only is not None:
        assert set(cfg.only) <= set(methods)
        methods = {name: methods[name] for name in cfg.only}
    base = instantiate(cfg.base, _convert_="all")
    assert base["rule"] is None and methods
    for name, spec in methods.items():
        assert spec.get("uncached") in (None, *methods), name
    if experiment not in (None, "dcd_caches"):  # the block-causal zoo DLM's protocols
        assert cfg.model == "smollm2-135m-bdlm" and isinstance(base["cache"], dk.dlm.BlockCausalCache)
        assert all(isinstance(spec["cache"], dk.dlm.BlockCausalCache) for spec in methods.values())
    if experiment == "dcd_caches":
        assert set(methods) == {"dcd", "dcd_prefix", "dcd_dual"} and cfg.synthetic == 0
    if experiment == "bdlm_synthetic_chat":  # the synthetic table only, as chat turns
        assert cfg.synthetic_style == "chat" and not cfg.gen_lengths and "threshold_95_block_causal" in methods
    if experiment and experiment.startswith("bdlm_spiffy"):  # each drafted rule beside the same rule undrafted
        drafted = {name for name, spec in methods.items() if isinstance(spec.get("draft"), dk.dlm.SpiffyDrafts)}
        assert drafted and all(methods[name].get("uncached") in (None, *methods) for name in drafted)
    if experiment == "bdlm_spiffy_pruned":  # pruned rows draft 7 of 210 nodes, beside the 7-node graph
        pruned = [spec["draft"] for spec in methods.values() if getattr(spec.get("draft"), "keep", None)]
        assert len(pruned) == 2 and all(d.keep == 7 and len(d.nodes) == 210 for d in pruned)


def test_dlm_bench_similarity_tells_a_late_shift_from_a_different_text():
    from decodekit.bench.dlm import similarity

    base = list(range(20))
    shifted = base[:5] + base[6:] + [99]  # one dropped token: every later slot disagrees
    assert sum(a == b for a, b in zip(shifted, base)) == 5
    assert similarity([shifted], [base]) == pytest.approx(2 * 19 / 40)
    assert similarity([base, list(range(100, 120))], [base, base]) == pytest.approx(0.5)  # the mean over prompts
