"""Per-row seeds: ``seed=[s_0, ..., s_{B-1}]`` gives each row its own randomness, as vLLM's per-request generators.

A row's sampled output depends only on its prompt, its seed and the settings: sampled in a batch of 8, alone
(three of the rows), or in the batch reversed, it is the same, for plain decoding and for every lossless verifier
in the registry paired with the n-gram drafter and a draft model. Per-row seeds still sample the target's law
(chi-square on a tiny vocabulary, as ``test_lossless.py``), and an int seed keeps one generator for the whole
batch, as before.
"""

from __future__ import annotations

import pytest
import torch

import decodekit as dk
from decodekit.drafters import ModelDrafter, NGramDrafter
from decodekit.errors import ConfigError
from decodekit.interfaces import ChecksSampling
from decodekit.models.tiny import perturbed, tiny_llama
from decodekit.policies import FixedLength
from decodekit.registry import available, resolve
from decodekit.sampling import RowGenerators, make_generator, sample, uniform
from tests.unit.test_host_syncs import OVERHEAD, CountingModelDrafter, count_syncs
from tests.unit.test_host_syncs import PROMPTS as HOST_SYNC_PROMPTS
from tests.unit.test_lossless import NEW, PROMPTS, ROWS_PER_PROMPT, SETTINGS, VOCAB, assert_matches

SMALL_VOCAB, EOS = 16, 15
SEEDS = [3, 14, 15, 92, 65, 35, 89, 79]
ALONE = (0, 3, 4)  # rows also run alone: the first, the longest prompt and the shortest (every row runs reversed)
SAMPLING = {
    "T1": dict(temperature=1.0),
    "T0.8-k8-p0.9": dict(temperature=0.8, top_k=8, top_p=0.9),
}


@pytest.fixture(scope="module")
def models():
    """A tiny target with a 16-token vocabulary (short repeats, so the n-gram drafter finds matches) and a
    perturbed copy as its draft model."""
    target = tiny_llama(0, vocab=SMALL_VOCAB, hidden=32, init=0.3)
    return target, perturbed(target, 0.3, seed=5)


@pytest.fixture(scope="module")
def prompts():
    """8 prompts of different lengths, each a repeated random 3-gram."""
    gen = torch.Generator().manual_seed(2)
    return [(torch.randint(0, EOS, (3,), generator=gen).tolist() * 5)[:n] for n in (3, 9, 5, 12, 2, 7, 4, 10)]


def lossless_verifiers() -> list[str]:
    return [name for name in available("verifier") if resolve("verifier", name).lossless]


CASES = [("plain", None)] + [(name, d) for name in lossless_verifiers() for d in ("ngram", "model")]


def components(models, verifier_name: str, drafter_name: str | None, sampling: dict):
    """``(drafter, verifier, policy)`` for a case, or a skip when the verifier cannot run it."""
    if drafter_name is None:
        return None, None, None
    verifier = resolve("verifier", verifier_name)()
    if isinstance(verifier, ChecksSampling):
        try:
            verifier.check(dk.SamplingParams(**sampling))
        except ConfigError:
            pytest.skip(f"{verifier_name} refuses {sampling}")
    drafter = NGramDrafter(max_ngram=2) if drafter_name == "ngram" else ModelDrafter(models[1])
    if drafter.draft_kind(dk.SamplingParams(**sampling)) not in verifier.accepts:
        pytest.skip(f"{verifier_name} does not accept the {drafter_name} drafter's drafts")
    return drafter, verifier, FixedLength(3)


def run(models, prompts, seeds, parts, sampling, max_new_tokens=16):
    drafter, verifier, policy = parts
    return dk.generate(
        models[0],
        prompts,
        drafter,
        verifier,
        policy,
        max_new_tokens=max_new_tokens,
        eos_token_id=EOS,
        seed=seeds,
        **sampling,
    )


@pytest.mark.parametrize("setting", list(SAMPLING))
@pytest.mark.parametrize(("verifier", "drafter"), CASES, ids=[f"{v}-{d}" if d else v for v, d in CASES])
def test_a_row_does_not_depend_on_its_batch(models, prompts, verifier, drafter, setting):
    sampling = SAMPLING[setting]
    parts = components(models, verifier, drafter, sampling)
    batch = run(models, prompts, SEEDS, parts, sampling)
    alone = [run(models, [prompts[i]], [SEEDS[i]], parts, sampling).sequences[0] for i in ALONE]
    assert [batch.sequences[i] for i in ALONE] == alone
    reversed_ = run(models, prompts[::-1], SEEDS[::-1], parts, sampling)
    assert reversed_.sequences[::-1] == batch.sequences
    # the test exercised what it is about: rows that stop at different rounds, and (with a drafter) drafts that
    # were accepted and rejected
    assert len({len(s) for s in batch.sequences}) > 1
    if drafter is not None:
        assert 0 < batch.stats.accepted < batch.stats.drafted


@pytest.mark.parametrize("drafter", [None, "model"])
def test_per_row_seeds_reproduce_and_differ(models, prompts, drafter):
    parts = components(models, "rejection", drafter, SAMPLING["T1"])
    first = run(models, prompts, SEEDS, parts, SAMPLING["T1"]).sequences
    assert run(models, prompts, list(SEEDS), parts, SAMPLING["T1"]).sequences == first
    assert run(models, prompts, torch.tensor(SEEDS), parts, SAMPLING["T1"]).sequences == first  # a 1-D tensor
    other = run(models, prompts, [s + 1000 for s in SEEDS], parts, SAMPLING["T1"]).sequences
    assert sum(a != b for a, b in zip(first, other)) >= 6
    # same prompt and seed in two rows: the same output; same prompt, different seeds: different outputs
    same = run(models, [prompts[3]] * 4, [7, 7, 8, 9], parts, SAMPLING["T1"]).sequences
    assert same[0] == same[1] and same[0] != same[2] and same[2] != same[3]


def test_an_int_seed_keeps_one_generator_for_the_batch():
    """Keys are ignored by a plain generator: the draws are exactly torch's, as before per-row seeds existed."""
    probs = torch.rand(6, 30, generator=torch.Generator().manual_seed(0))
    noise = torch.empty(6, 30).exponential_(generator=torch.Generator().manual_seed(4))
    expected = (probs / noise).argmax(-1)
    assert torch.equal(sample(probs, torch.Generator().manual_seed(4), key=("draft", 3)), expected)
    coins = uniform((6, 5), torch.Generator().manual_seed(4), torch.device("cpu"), key="other")
    assert torch.equal(coins, torch.rand(6, 5, generator=torch.Generator().manual_seed(4)))
    gen = make_generator(4, torch.device("cpu"))
    assert isinstance(gen, torch.Generator) and gen.initial_seed() == 4
    assert make_generator(None, torch.device("cpu")) is None
    assert isinstance(make_generator([1, 2], torch.device("cpu")), RowGenerators)


def test_row_draws_depend_on_seed_length_and_key_only():
    batch = RowGenerators([10, 20, 30])
    batch.begin_round([5, 9, 7])
    alone = RowGenerators([20])
    alone.begin_round([9])
    probs = torch.rand(3, 50, generator=torch.Generator().manual_seed(0))
    assert sample(probs, batch)[1] == sample(probs[1:2], alone)[0]
    coins, one = uniform((3, 4), batch, torch.device("cpu")), uniform((1, 4), alone, torch.device("cpu"))
    assert torch.equal(coins[1], one[0])
    assert not torch.equal(coins[1], uniform((1, 4), alone, torch.device("cpu"), key=("draft", 0))[0])
    alone.begin_round([10])  # the next round: new values
    assert not torch.equal(one, uniform((1, 4), alone, torch.device("cpu")))
    batch.select_rows([2, 1])  # rows 0 left the batch; the rest keep their seeds
    batch.begin_round([7, 9])
    assert torch.equal(uniform((2, 4), batch, torch.device("cpu"))[1], one[0])
    with pytest.raises(ValueError, match="live rows"):
        batch.begin_round([1, 2, 3])


def test_coins_are_prefix_stable_on_the_cpu():
    """Row ``b``'s coins come from ``torch.rand(n)`` with ``n`` the batch's widest draft: its first ``k`` values
    must not depend on ``n`` (true of the CPU's mt19937; see RowGenerators for CUDA)."""
    gens = RowGenerators([1, -2, 2**63 + 5])
    gens.begin_round([4, 4, 100])
    widest = uniform((3, 300), gens, torch.device("cpu"))
    for n in (1, 2, 3, 7, 16, 17, 64, 299):
        assert torch.equal(uniform((3, n), gens, torch.device("cpu")), widest[:, :n])
    gen = torch.Generator()
    for n in (1, 5, 16, 33, 257):
        assert torch.equal(
            torch.rand(n, generator=gen.manual_seed(9)), torch.rand(600, generator=gen.manual_seed(9))[:n]
        )


# ------------------------------------------------------------------------------------------- distribution
@pytest.fixture(scope="module")
def lossless_models():
    target = tiny_llama(0, vocab=VOCAB, hidden=32, init=0.3)  # the same target as test_lossless.py
    return target, perturbed(target, 0.3, seed=5)


@pytest.mark.parametrize("drafter", [None, "model", "ngram"])
def test_per_row_seeds_sample_the_target_law(lossless_models, drafter):
    """One seed per row (seeds 0..2R-1, hashed per row): the first 3 tokens follow the warped target's joint law."""
    target, draft = lossless_models
    setting = "T1"
    built = {None: None, "model": ModelDrafter(draft), "ngram": NGramDrafter(max_ngram=2)}[drafter]
    prompts = [p for p in PROMPTS for _ in range(ROWS_PER_PROMPT)]
    out = dk.generate(
        target,
        prompts,
        built,
        policy=FixedLength(2),
        max_new_tokens=NEW + 1,  # one past the counted tokens: the first round drafts its whole chain over them
        eos_token_id=(),
        seed=list(range(len(prompts))),
        **SETTINGS[setting],
    )
    seqs = torch.tensor(out.sequences).reshape(len(PROMPTS), ROWS_PER_PROMPT, NEW + 1)[..., :NEW]
    codes = seqs[..., 0] * VOCAB**2 + seqs[..., 1] * VOCAB + seqs[..., 2]
    assert_matches(target, [torch.bincount(c, minlength=VOCAB**NEW) for c in codes], setting)
    if drafter is not None:
        assert out.stats.accepted > 0


@pytest.mark.parametrize(("drafter", "budget"), [(None, 1), ("ngram", 2), ("model", 2)])
def test_per_row_seeds_add_no_host_syncs(target, drafter, budget):
    """Seeding per row uses host ints only: the round budgets of ``test_host_syncs.py`` hold with seed lists."""
    drafter = {None: None, "ngram": NGramDrafter(), "model": CountingModelDrafter(perturbed(target, 0.3, seed=1))}[
        drafter
    ]
    prompts = HOST_SYNC_PROMPTS
    kwargs = dict(policy=FixedLength(3), max_new_tokens=40, eos_token_id=(), temperature=1.0)
    dk.generate(target, prompts, drafter, max_new_tokens=4, temperature=1.0, seed=[1, 2, 3])  # warm up
    leaves = getattr(drafter, "leaves", 0)
    with count_syncs() as counter:
        out = dk.generate(target, prompts, drafter, seed=[5, 6, 7], **kwargs)
    leaves = getattr(drafter, "leaves", 0) - leaves
    assert counter[0] <= budget * out.stats.rounds + OVERHEAD + leaves
