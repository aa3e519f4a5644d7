"""Tiny random models built from configs: for tests and loop-overhead benchmarks (no files, no network)."""

from __future__ import annotations

import copy

import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM


def tiny_llama(
    seed: int, vocab: int = 128, hidden: int = 64, layers: int = 2, init: float = 0.2, **config: object
) -> LlamaForCausalLM:
    """A random float32 ``LlamaForCausalLM``.

    Args:
        seed: weight seed (the same seed gives the same model).
        vocab, hidden, layers: vocabulary size, hidden size, number of decoder layers.
        init: ``initializer_range``; larger values give more peaked next-token distributions.
        config: other ``LlamaConfig`` fields (defaults: no BOS/EOS/PAD ids, context 256).
    """
    fields = _fields(vocab, hidden, layers, init, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    torch.manual_seed(seed)
    return LlamaForCausalLM(LlamaConfig(**(fields | config))).eval()


def _fields(vocab: int, hidden: int, layers: int, init: float, **extra: object) -> dict[str, object]:
    """Config fields shared by the tiny models: 4 query heads, 2 KV heads, MLP width 2 x hidden, context 256."""
    return dict(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        initializer_range=init,
        **extra,
    )


def tiny_qwen2(
    seed: int, vocab: int = 128, hidden: int = 64, layers: int = 2, init: float = 0.2, **config: object
) -> Qwen2ForCausalLM:
    """A random float32 ``Qwen2ForCausalLM`` (attention with biases); arguments as :func:`tiny_llama`."""
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(Qwen2Config(**(_fields(vocab, hidden, layers, init) | config))).eval()


def perturbed(model: torch.nn.Module, scale: float, seed: int) -> torch.nn.Module:
    """A copy of ``model`` with Gaussian noise (``scale`` x each tensor's std) on every weight: a draft model
    that partly agrees with ``model``."""
    out = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in out.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * scale * p.std().clamp(min=1e-3))
    return out
