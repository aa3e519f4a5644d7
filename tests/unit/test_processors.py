"""Logits processors apply to every distribution at its exact context, for the target and a model drafter alike.

* Greedy: with ``repetition_penalty``, ``no_repeat_ngram_size``, ``bad_words_ids``, ``suppress_tokens``,
  ``min_new_tokens`` or a custom ``logits_processor``, every drafter (none, n-gram, model, a token tree) gives
  transformers' ``generate`` output with the same options, token for token; each option changes the output, so the
  comparison has power. The target drafting for itself has every draft accepted: the drafter's distribution is
  processed with the same contexts as the target's.
* Sampling: speculative sampling with a repetition penalty is lossless for the processed distribution (exact
  enumeration over a vocabulary of 8, as in ``test_lossless.py``); processing every scored position with the
  committed tokens only, without its draft path (the classic bug), is detected by the same test.
"""

from __future__ import annotations

import itertools
import sys

import pytest
import torch
from transformers.generation import RepetitionPenaltyLogitsProcessor

import decodekit as dk
from decodekit.drafters import ModelDrafter, NGramDrafter
from decodekit.models.tiny import perturbed, tiny_llama
from decodekit.policies import FixedLength
from decodekit.sampling import probs_from_logits
from decodekit.spec.processors import process_next
from decodekit.verifiers import RejectionVerifier
from tests.unit.stats import chi_square_pvalue, total_variation, tv_noise
from tests.unit.test_drafts_and_budgets import BranchyTree

MAX_NEW = 24


class Bump:
    """A custom processor: adds ``weight`` to the logit of (last token + 1) mod V, a function of the context only."""

    def __init__(self, weight: float = 3.0) -> None:
        self.weight = weight

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        target = (input_ids[:, -1:] + 1) % scores.shape[-1]
        return scores.scatter_add(1, target, torch.full(target.shape, self.weight, dtype=scores.dtype))


def options(name: str, plain: list[list[int]]) -> dict:
    """The generate() options of case ``name``; token bans use tokens the plain output has, so they matter."""
    a, b, c = plain[0][3], plain[1][2], plain[2][5]
    return {
        "repetition_penalty": dict(repetition_penalty=1.8),
        "no_repeat_ngram_size": dict(no_repeat_ngram_size=1),
        "bad_words_ids": dict(bad_words_ids=[[a], [plain[1][1], b]]),
        "suppress_tokens": dict(suppress_tokens=[a, b, c]),
        "stacked": dict(repetition_penalty=1.3, no_repeat_ngram_size=2, suppress_tokens=[c]),
        "custom": dict(logits_processor=[Bump()]),
    }[name]


OPTIONS = ["repetition_penalty", "no_repeat_ngram_size", "bad_words_ids", "suppress_tokens", "stacked", "custom"]


class TreeBudget:
    """Budget of 9 nodes, depth 4, width 2 for :class:`BranchyTree`."""

    def plan(self, state):
        full = torch.full_like(state.lengths, 9)
        return dk.DraftBudget(full, torch.full_like(full, 4), width=2, node_bound=9, depth_bound=4)


def hf(model, prompt: list[int], eos: int | None = None, **options) -> list[int]:
    """transformers' greedy generate of one prompt with ``options``, cut after EOS."""
    out = model.generate(
        torch.tensor([prompt]), max_new_tokens=MAX_NEW, do_sample=False, eos_token_id=eos, pad_token_id=0, **options
    )
    tokens = out[0, len(prompt) :].tolist()
    return tokens[: tokens.index(eos) + 1] if eos is not None and eos in tokens else tokens


@pytest.fixture(scope="module")
def drafters(target):
    return {
        "none": lambda: None,
        "ngram": lambda: NGramDrafter(max_ngram=2),
        "model-self": lambda: ModelDrafter(target),
        "model-perturbed": lambda: ModelDrafter(perturbed(target, 0.3, seed=2)),
        "tree": lambda: BranchyTree(target),
    }


@pytest.fixture(scope="module")
def plain(target, ragged_prompts):
    return [hf(target, p) for p in ragged_prompts]


@pytest.fixture(scope="module")
def processed(target, ragged_prompts, plain):
    """transformers' output with each option (computed once an option; every drafter compares with it)."""
    done: dict[str, list[list[int]]] = {}

    def expected(option: str) -> list[list[int]]:
        if option not in done:
            done[option] = [hf(target, p, **options(option, plain)) for p in ragged_prompts]
        return done[option]

    return expected


@pytest.mark.parametrize("option", OPTIONS)
@pytest.mark.parametrize("drafter", ["none", "ngram", "model-self", "model-perturbed", "tree"])
def test_greedy_with_processors_equals_transformers(
    target, ragged_prompts, drafters, plain, processed, option, drafter
):
    kwargs = options(option, plain)
    expected = processed(option)
    assert expected != plain, f"{option} does not change the output: the comparison would prove nothing"
    policy = TreeBudget() if drafter == "tree" else FixedLength(3)
    out = dk.generate(
        target, ragged_prompts, drafters[drafter](), policy=policy, max_new_tokens=MAX_NEW, eos_token_id=(), **kwargs
    )
    assert out.sequences == expected
    if drafter in ("model-self", "model-perturbed", "tree"):  # (n-gram drafts are repeats: penalised, rejected)
        assert out.stats.accepted > 0
    if drafter == "model-self":  # the drafter's distributions get the same processing and contexts
        assert out.stats.draft_acceptance_rate == 1.0


FLOOR = 10


@pytest.fixture(scope="module")
def floored(target, ragged_prompts, plain) -> tuple[int, list[list[int]]]:
    """An EOS token row 0 emits early (without ``min_new_tokens`` it ends there), and transformers' output with
    ``min_new_tokens=FLOOR``, which differs."""
    eos = plain[0][2]
    expected = [hf(target, p, eos=eos, min_new_tokens=FLOOR) for p in ragged_prompts]
    assert expected != [hf(target, p, eos=eos) for p in ragged_prompts]
    assert all(len(s) >= FLOOR for s in expected)
    return eos, expected


@pytest.mark.parametrize("drafter", ["none", "ngram", "model-self", "tree"])
def test_min_new_tokens_counts_each_row_from_its_prompt(target, ragged_prompts, drafters, floored, drafter):
    (eos, expected), floor = floored, FLOOR
    policy = TreeBudget() if drafter == "tree" else FixedLength(3)
    out = dk.generate(
        target, ragged_prompts, drafters[drafter](), policy=policy, max_new_tokens=MAX_NEW, eos_token_id=eos,
        min_new_tokens=floor,
    )  # fmt: skip
    assert out.sequences == expected


# ------------------------------------------------------------------------------- lossless sampling, vocab 8
VOCAB, NEW, ROWS_PER_PROMPT = 8, 3, 8_000  # the unprocessed law is still rejected at p < 1e-6
PROMPTS = ([7, 4, 4, 4], [2, 7, 3, 3, 3, 4, 7])
PENALTY = 2.0


@pytest.fixture(scope="module")
def small():
    target = tiny_llama(0, vocab=VOCAB, hidden=32, init=0.3)
    return target, perturbed(target, 0.3, seed=5)


def exact_joint(model, prompt: list[int], sampling: dk.SamplingParams, processor) -> torch.Tensor:
    """``[V, V, V]`` law of the first 3 tokens: plain transformers forwards, each position's logits processed
    with its own context (prompt + the tokens before it), then warped."""
    suffixes = torch.tensor(list(itertools.product(range(VOCAB), repeat=NEW - 1)))  # [V^2, 2]
    inputs = torch.cat([torch.tensor(prompt).expand(len(suffixes), -1), suffixes], 1)
    with torch.no_grad():
        logits = model(inputs).logits.double()[:, len(prompt) - 1 :]  # [V^2, 3, V]
    if processor is not None:
        logits = torch.stack([processor(inputs[:, : len(prompt) + t], logits[:, t]) for t in range(NEW)], 1)
    probs = probs_from_logits(logits, sampling)
    p1, p2, p3 = probs[0, 0], probs[::VOCAB, 1], probs[:, 2].reshape(VOCAB, VOCAB, VOCAB)
    return p1[:, None, None] * p2[:, :, None] * p3


def sample_counts(target, drafter, setting: dict, processor, seed: int) -> list[torch.Tensor]:
    prompts = [p for p in PROMPTS for _ in range(ROWS_PER_PROMPT)]
    out = dk.generate(
        target,
        prompts,
        drafter,
        RejectionVerifier(),
        FixedLength(2),
        max_new_tokens=NEW + 1,
        eos_token_id=(),
        seed=seed,
        logits_processor=[processor],
        **setting,
    )  # fmt: skip  (one token past the counted ones, so the first round drafts its whole chain of 2 over them)
    seqs = torch.tensor(out.sequences).reshape(len(PROMPTS), ROWS_PER_PROMPT, NEW + 1)[..., :NEW]
    codes = seqs[..., 0] * VOCAB**2 + seqs[..., 1] * VOCAB + seqs[..., 2]
    if drafter is not None:
        assert 0.05 < out.stats.draft_acceptance_rate < 0.95
    return [torch.bincount(c, minlength=VOCAB**NEW) for c in codes]


def pvalues(target, counts, setting: dict, processor) -> list[tuple[float, float]]:
    sampling = dk.SamplingParams(**setting)
    out = []
    for prompt, c in zip(PROMPTS, counts):
        exact = exact_joint(target, prompt, sampling, processor)
        out.append((chi_square_pvalue(c, exact), total_variation(c, exact) - 2 * tv_noise(exact, ROWS_PER_PROMPT)))
    return out


SETTINGS = {"T1": dict(temperature=1.0), "T0.7-p0.9": dict(temperature=0.7, top_p=0.9)}
PROCESSORS = {"repetition": lambda: RepetitionPenaltyLogitsProcessor(PENALTY), "bump": lambda: Bump(1.5)}


@pytest.mark.parametrize(
    ("drafter", "setting", "processor"),
    [("model", "T1", "repetition"), ("model", "T0.7-p0.9", "repetition"), ("ngram", "T1", "repetition"),
     ("model", "T1", "bump")],
)  # fmt: skip
def test_speculative_sampling_with_processors_is_lossless(small, drafter, setting, processor):
    target, draft = small
    make = {"model": lambda: ModelDrafter(draft), "ngram": lambda: NGramDrafter(max_ngram=2)}[drafter]
    counts = sample_counts(target, make(), SETTINGS[setting], PROCESSORS[processor](), seed=21)
    for p, excess_tv in pvalues(target, counts, SETTINGS[setting], PROCESSORS[processor]()):
        assert p > 1e-4 and excess_tv < 0.005, f"the processed target law is rejected (p={p:.2e})"
    unprocessed = pvalues(target, counts, SETTINGS[setting], None)
    assert min(p for p, _ in unprocessed) < 1e-6, "the processor did not change the law: the test has no power"


def test_processing_without_the_draft_path_is_detected(small, monkeypatch):
    """The classic bug: process every scored position with the committed context only."""
    target, draft = small

    def committed_context_only(state, logits, draft):
        return torch.stack([process_next(state, logits[:, s]) for s in range(logits.shape[1])], 1)

    monkeypatch.setattr(sys.modules["decodekit.spec.loop"], "process_scored", committed_context_only)
    counts = sample_counts(target, ModelDrafter(draft), SETTINGS["T1"], Bump(1.5), seed=22)
    assert min(p for p, _ in pvalues(target, counts, SETTINGS["T1"], Bump(1.5))) < 1e-6
