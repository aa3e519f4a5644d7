"""sampling.py: the same warping as transformers' logits processors, and an exact seeded sampler."""

from __future__ import annotations

import pytest
import torch
from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

import decodekit as dk
from decodekit.sampling import probs_from_logits, sample
from tests.unit.stats import chi_square_pvalue


@pytest.mark.parametrize(
    ("temperature", "top_k", "top_p"), [(1.0, None, None), (0.7, None, 0.9), (1.3, 5, None), (0.5, 20, 0.8)]
)
def test_warping_matches_transformers(temperature, top_k, top_p):
    logits = torch.randn(16, 50, generator=torch.Generator().manual_seed(0)) * 3
    scores = TemperatureLogitsWarper(temperature)(None, logits.clone())
    if top_k is not None:
        scores = TopKLogitsWarper(top_k)(None, scores)
    if top_p is not None:
        scores = TopPLogitsWarper(top_p)(None, scores)
    expected = scores.softmax(-1)
    got = probs_from_logits(logits, dk.SamplingParams(temperature, top_k, top_p))
    torch.testing.assert_close(got, expected)
    assert ((got > 0) == (expected > 0)).all()


def test_greedy_is_a_point_mass_on_the_first_argmax():
    logits = torch.tensor([[0.0, 2.0, 2.0, 1.0]])
    assert probs_from_logits(logits, dk.SamplingParams(0.0)).tolist() == [[0.0, 1.0, 0.0, 0.0]]


def test_sampler_draws_from_the_given_distribution():
    probs = torch.tensor([0.5, 0.25, 0.125, 0.0625, 0.0625, 0.0])
    gen = torch.Generator().manual_seed(0)
    draws = sample(probs.expand(200_000, -1), gen)
    counts = torch.bincount(draws, minlength=6)
    assert counts[-1] == 0  # zero probability is never drawn
    assert chi_square_pvalue(counts[:-1], probs[:-1]) > 1e-4


def test_sampler_is_seeded():
    probs = torch.rand(8, 100)
    a = sample(probs, torch.Generator().manual_seed(5))
    b = sample(probs, torch.Generator().manual_seed(5))
    assert torch.equal(a, b)
