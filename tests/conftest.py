"""Shared fixtures: tiny random models built from configs (no files, no network)."""

from __future__ import annotations

import pytest
import torch

import decodekit as dk
from decodekit.models.tiny import perturbed, tiny_llama

__all__ = ["assert_greedy_twice", "perturbed", "tiny_llama"]


@pytest.fixture(scope="session")
def target():
    return tiny_llama(0)


@pytest.fixture(scope="session")
def ragged_prompts():
    gen = torch.Generator().manual_seed(1)
    lengths = [7, 2, 13, 4]
    return [torch.randint(0, 128, (n,), generator=gen).tolist() for n in lengths]


def assert_greedy_twice(target, prompts, drafter, policy, reference, max_new_tokens):
    """Two greedy calls with ``drafter`` (the second starts from whatever state the first left it) each equal
    ``reference`` token for token, with every round's draft checked (``debug=True``) and some, not all, drafted
    tokens accepted (so the equality is not vacuous)."""
    for _ in range(2):
        out = dk.generate(
            target,
            prompts,
            drafter,
            dk.verifiers.GreedyVerifier(),
            policy,
            max_new_tokens=max_new_tokens,
            eos_token_id=(),
            debug=True,
        )
        assert out.sequences == reference
        assert 0 < out.stats.accepted < out.stats.drafted
