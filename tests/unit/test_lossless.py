"""Speculative sampling is lossless: the joint law of the first 3 generated tokens equals the target's.

Tiny vocabulary (8 tokens), so the target's exact joint over 8^3 outcomes is computed by enumeration with a
plain transformers forward (independent of decodekit's cache and loop). Each configuration draws 12k rows
(6k for each of two ragged prompts, in one batch) and must pass a chi-square test and a total-variation
bound; deliberately biased verifiers and drafters must fail the same test at that size, which shows it has the
power to catch them (the weakest control, a tree draft labelled with the wrong drafting process in
``test_tree_lossless.py``, gives p = 7e-9; the others p < 1e-14).
"""

from __future__ import annotations

import dataclasses
import itertools

import pytest
import torch

import decodekit as dk
from decodekit.drafters import ModelDrafter, NGramDrafter
from decodekit.models.tiny import perturbed, tiny_llama
from decodekit.policies import EntropyStop, FixedLength, GammaTunePlus, HeuristicLength, KLDStability, Stack
from decodekit.sampling import probs_from_logits
from decodekit.verifiers import RejectionVerifier
from tests.unit.spies import Wrapped
from tests.unit.stats import chi_square_pvalue, total_variation, tv_noise

VOCAB, NEW, ROWS_PER_PROMPT = 8, 3, 6_000  # every biased control still fails: p <= 7e-9 (1e-6 needed)
PROMPTS = ([7, 4, 4, 4], [2, 7, 3, 3, 3, 4, 7])  # ragged; repeats the target likes give n-gram matches
SETTINGS = {
    "T1": dict(temperature=1.0),
    "T0.7-p0.9": dict(temperature=0.7, top_p=0.9),
    "T1-k3": dict(temperature=1.0, top_k=3),
}


@pytest.fixture(scope="module")
def models():
    target = tiny_llama(0, vocab=VOCAB, hidden=32, init=0.3)
    return target, perturbed(target, 0.3, seed=5)


def exact_joint(model, prompt: list[int], sampling: dk.SamplingParams) -> torch.Tensor:
    """``[V, V, V]`` probability of each first-3-token outcome under the warped target."""
    prefixes = torch.tensor(list(itertools.product(range(VOCAB), repeat=NEW - 1)))  # [V^2, 2]
    inputs = torch.cat([torch.tensor(prompt).expand(len(prefixes), -1), prefixes], 1)
    with torch.no_grad():
        probs = probs_from_logits(model(inputs).logits.double(), sampling)[:, len(prompt) - 1 :]  # [V^2, 3, V]
    p1 = probs[0, 0]  # same for every prefix
    p2 = probs[::VOCAB, 1]  # rows whose second token is 0: p(t2 | t1)
    p3 = probs[:, 2].reshape(VOCAB, VOCAB, VOCAB)  # p(t3 | t1, t2)
    return p1[:, None, None] * p2[:, :, None] * p3


def sample_counts(target, drafter, verifier, policy, setting: str, seed: int) -> list[torch.Tensor]:
    prompts = [p for p in PROMPTS for _ in range(ROWS_PER_PROMPT)]
    out = dk.generate(
        target,
        prompts,
        drafter,
        verifier,
        policy,
        max_new_tokens=NEW + 1,
        eos_token_id=(),
        seed=seed,
        **SETTINGS[setting],
    )  # one token past the counted ones: a round never drafts past max_new_tokens, so the first round drafts a
    # whole chain of 2 (or a tree of depth 2) over the counted tokens, not 1
    seqs = torch.tensor(out.sequences).reshape(len(PROMPTS), ROWS_PER_PROMPT, NEW + 1)[..., :NEW]
    codes = seqs[..., 0] * VOCAB**2 + seqs[..., 1] * VOCAB + seqs[..., 2]
    return [torch.bincount(c, minlength=VOCAB**NEW) for c in codes], out.stats


def assert_matches(target, counts, setting: str) -> None:
    sampling = dk.SamplingParams(**SETTINGS[setting])
    for prompt, c in zip(PROMPTS, counts):
        exact = exact_joint(target, prompt, sampling)
        pvalue, tv = chi_square_pvalue(c, exact), total_variation(c, exact)
        assert pvalue > 1e-4, f"chi-square rejects the target law (p={pvalue:.2e}, TV={tv:.4f})"
        assert tv < 2 * tv_noise(exact, ROWS_PER_PROMPT) + 0.005, f"TV {tv:.4f} above sampling noise"


def assert_detected(target, counts, setting: str) -> None:
    sampling = dk.SamplingParams(**SETTINGS[setting])
    pvalues = [chi_square_pvalue(c, exact_joint(target, p, sampling)) for p, c in zip(PROMPTS, counts)]
    assert min(pvalues) < 1e-6, f"a biased sampler went undetected (p-values {pvalues})"


CASES = {
    "autoregressive": lambda draft: (None, FixedLength(0)),
    "model": lambda draft: (ModelDrafter(draft), FixedLength(2)),
    "model-heuristic": lambda draft: (ModelDrafter(draft), HeuristicLength(initial=1)),
    "model-argmax": lambda draft: (ModelDrafter(draft, temperature=0.0), FixedLength(2)),
    "model-hotter": lambda draft: (ModelDrafter(draft, temperature=1.5), FixedLength(2)),
    "ngram": lambda draft: (NGramDrafter(max_ngram=2), FixedLength(2)),
    # adaptive lengths: per-row lengths from past acceptance, stops from the draft's confidence or entropy, the KL
    # of the round record; none of it may change the output law
    "model-gammatune_plus": lambda draft: (ModelDrafter(draft), GammaTunePlus(initial=1, jump=1, threshold=0.3)),
    "model-kld-adaedl": lambda draft: (
        ModelDrafter(draft),
        Stack(
            KLDStability(initial=2, calibration=1, short=2, long=4),
            EntropyStop(scale=0.2, threshold=0.5, adaptive=True, step=0.2),
            batch_cap=0.5,
        ),
    ),
}


@pytest.mark.parametrize(
    ("case", "setting"),
    [
        ("autoregressive", "T1"),
        ("model", "T1"),
        ("model", "T0.7-p0.9"),
        ("model", "T1-k3"),
        ("model-heuristic", "T1"),
        ("model-gammatune_plus", "T1"),
        ("model-kld-adaedl", "T0.7-p0.9"),
        ("model-argmax", "T0.7-p0.9"),
        ("model-hotter", "T1"),
        ("ngram", "T1"),
        ("ngram", "T0.7-p0.9"),
    ],
)
def test_speculative_sampling_is_lossless(models, case, setting):
    target, draft = models
    drafter, policy = CASES[case](draft)
    counts, stats = sample_counts(target, drafter, RejectionVerifier(), policy, setting, seed=11)
    assert_matches(target, counts, setting)
    if drafter is not None:  # the drafts must actually be accepted sometimes, or nothing was tested
        assert 0.05 < stats.draft_acceptance_rate < 0.95


class PointMass(RejectionVerifier):
    """Verifies sampled drafts as point masses (drops q). Conditional on any drafted token, accepting it with
    probability p(x) and otherwise sampling p without x yields p, so this is lossless, only less efficient."""

    def verify(self, draft, logits, sampling, generator):
        draft = dataclasses.replace(draft, kind=dk.DraftKind.DETERMINISTIC, q=None)
        return super().verify(draft, logits, sampling, generator)


class ResidualFromTarget:
    """Biased on purpose: accepts with min(1, p/q) but, after a rejection, samples from p instead of the
    residual norm(max(p - q, 0)), so tokens the draft favours come out too often."""

    accepts = frozenset({dk.DraftKind.SAMPLED})
    lossless = False

    def verify(self, draft, logits, sampling, generator):
        p = probs_from_logits(logits, sampling)
        if draft.num_nodes == 0:  # end of a row: plain sampling
            return RejectionVerifier().verify(draft, logits, sampling, generator)
        x = draft.tokens[..., None]
        ratio = p[:, :-1].gather(-1, x)[..., 0] / draft.q.gather(-1, x)[..., 0]
        ok = (torch.rand(ratio.shape, generator=generator) < ratio) & draft.valid  # a row's draft may be shorter
        num = ok.long().cumprod(-1).sum(-1)
        nxt = torch.multinomial(p[torch.arange(len(num)), num], 1, generator=generator)[:, 0]
        return dk.Verdict(accepted=draft.path(num - 1, num), num_accepted=num, next_token=nxt)


class MisreportsQ(Wrapped):
    """Biased on purpose: a drafter that samples from q but reports sqrt(q) (renormalised), the classic
    "scored against a q it did not sample from" bug."""

    def propose(self, state, budget):
        draft = self.inner.propose(state, budget)
        flat = draft.q.sqrt()
        return dataclasses.replace(draft, q=flat / flat.sum(-1, keepdim=True))


def test_point_mass_verification_of_sampled_drafts_is_lossless(models):
    target, draft = models
    counts, stats = sample_counts(target, ModelDrafter(draft), PointMass(), FixedLength(2), "T1", seed=12)
    assert_matches(target, counts, "T1")
    assert stats.accepted > 0


def test_verifier_with_wrong_residual_is_detected(models):
    target, draft = models
    counts, _ = sample_counts(target, ModelDrafter(draft), ResidualFromTarget(), FixedLength(2), "T1", seed=14)
    assert_detected(target, counts, "T1")


def test_drafter_that_misreports_q_is_detected(models):
    target, draft = models
    counts, _ = sample_counts(
        target, MisreportsQ(ModelDrafter(draft)), RejectionVerifier(), FixedLength(2), "T1", seed=13
    )
    assert_detected(target, counts, "T1")


def test_seeded_sampling_is_reproducible(models):
    target, draft = models

    def run(seed):
        return dk.generate(
            target,
            [list(PROMPTS[0]), list(PROMPTS[1])] * 4,
            ModelDrafter(draft),
            max_new_tokens=12,
            temperature=1.0,
            eos_token_id=(),
            seed=seed,
        ).sequences

    assert run(3) == run(3)
    assert run(3) != run(4)
