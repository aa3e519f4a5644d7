"""Shared fixtures: tiny random models built from configs (no files, no network)."""

from __future__ import annotations

import pytest
import torch

from decodekit.models.tiny import perturbed, tiny_llama

__all__ = ["perturbed", "tiny_llama"]


@pytest.fixture(scope="session")
def target():
    return tiny_llama(0)


@pytest.fixture(scope="session")
def ragged_prompts():
    gen = torch.Generator().manual_seed(1)
    lengths = [7, 2, 13, 4]
    return [torch.randint(0, 128, (n,), generator=gen).tolist() for n in lengths]
