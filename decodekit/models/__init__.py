"""Model adapters and :func:`load_model`."""

from __future__ import annotations

from typing import Any

import torch

from decodekit.kernels.cpu import apply_kernels
from decodekit.models.base import LanguageModel
from decodekit.models.hf import HFCausalLM
from decodekit.models.zoo import ZOO, load_zoo_model

__all__ = ["ZOO", "HFCausalLM", "LanguageModel", "load_model", "load_zoo_model"]


def load_model(
    spec: Any,
    tokenizer: Any = None,
    *,
    dtype: torch.dtype | str | None = None,
    device: torch.device | str | None = None,
    kernels: str | None = None,
) -> LanguageModel:
    """Return a :class:`LanguageModel` for ``spec``.

    Args:
        spec: a :class:`LanguageModel` (returned as is), a loaded transformers causal LM, a zoo name
            (a key of :data:`~decodekit.models.zoo.ZOO`, e.g. ``"smollm2-135m-instruct"``), or a local path
            to a causal LM (``from_pretrained``).
        tokenizer: the tokenizer to attach (loaded from the path when ``spec`` is a path).
        dtype: optional dtype to cast the model to.
        device: optional device to move the model to.
        kernels: optional CPU linear kernels, ``"onednn"`` (same float32 model, faster small-batch linears) or
            ``"int8"`` (a lossy int8 copy, for draft models); see :mod:`decodekit.kernels.cpu`.
    """
    if isinstance(spec, LanguageModel):
        return spec
    if isinstance(spec, str) and spec in ZOO:
        model = load_zoo_model(spec, dtype=dtype, device=device, kernels=kernels)
        model.tokenizer = tokenizer or model.tokenizer
        return model
    if isinstance(spec, str):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        tokenizer = tokenizer or AutoTokenizer.from_pretrained(spec)
        spec = AutoModelForCausalLM.from_pretrained(spec, dtype=dtype or "auto")
    if not isinstance(spec, torch.nn.Module):
        raise TypeError(f"load_model expects a LanguageModel, a transformers model or a path, got {type(spec)!r}")
    if dtype is not None:
        spec = spec.to(getattr(torch, dtype) if isinstance(dtype, str) else dtype)
    if device is not None:
        spec = spec.to(device)
    return HFCausalLM(apply_kernels(spec, kernels), tokenizer=tokenizer)
