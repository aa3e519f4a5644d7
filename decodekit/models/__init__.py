"""Model adapters and :func:`load_model`."""

from __future__ import annotations

from typing import Any

import torch

from decodekit.models.base import LanguageModel
from decodekit.models.hf import HFCausalLM

__all__ = ["HFCausalLM", "LanguageModel", "load_model"]


def load_model(
    spec: Any,
    tokenizer: Any = None,
    *,
    dtype: torch.dtype | str | None = None,
    device: torch.device | str | None = None,
) -> LanguageModel:
    """Return a :class:`LanguageModel` for ``spec``.

    Args:
        spec: a :class:`LanguageModel` (returned as is), a loaded transformers causal LM, or a local path
            to one (``from_pretrained``).
        tokenizer: the tokenizer to attach (loaded from the path when ``spec`` is a path).
        dtype: optional dtype to cast the model to.
        device: optional device to move the model to.
    """
    if isinstance(spec, LanguageModel):
        return spec
    if isinstance(spec, str):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        hf_model = AutoModelForCausalLM.from_pretrained(spec, dtype=dtype or "auto")
        tokenizer = tokenizer or AutoTokenizer.from_pretrained(spec)
        spec = hf_model
    if not isinstance(spec, torch.nn.Module):
        raise TypeError(f"load_model expects a LanguageModel, a transformers model or a path, got {type(spec)!r}")
    if dtype is not None:
        spec = spec.to(getattr(torch, dtype) if isinstance(dtype, str) else dtype)
    if device is not None:
        spec = spec.to(device)
    return HFCausalLM(spec, tokenizer=tokenizer)
