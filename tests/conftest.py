"""Shared fixtures: tiny random models built from configs (no files, no network)."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM


def tiny_llama(seed: int, vocab: int = 128, hidden: int = 64, layers: int = 2, init: float = 0.2, **kw):
    """A random LlamaForCausalLM in float32. ``init`` (initializer_range) sets how peaked its distributions are."""
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=kw.pop("max_position_embeddings", 256),
        initializer_range=init,
        bos_token_id=None,
        eos_token_id=kw.pop("eos_token_id", None),
        pad_token_id=None,
        **kw,
    )
    return LlamaForCausalLM(config).eval()


def perturbed(model, scale: float, seed: int):
    """A copy of ``model`` with Gaussian noise on every weight: a draft model that agrees partly with it."""
    out = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in out.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * scale * p.std().clamp(min=1e-3))
    return out


@pytest.fixture(scope="session")
def target():
    return tiny_llama(0)


@pytest.fixture(scope="session")
def ragged_prompts():
    gen = torch.Generator().manual_seed(1)
    lengths = [7, 2, 13, 4]
    return [torch.randint(0, 128, (n,), generator=gen).tolist() for n in lengths]
