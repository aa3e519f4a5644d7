"""Model adapters and :func:`load_model`."""

from __future__ import annotations

from typing import Any

import torch

from decodekit.kernels.cpu import apply_kernels
from decodekit.models.base import LanguageModel, ModelOutput
from decodekit.models.dtypes import parse_dtype
from decodekit.models.hf import HFCausalLM
from decodekit.models.zoo import ZOO, load_zoo_model

__all__ = ["ZOO", "HFCausalLM", "LanguageModel", "ModelOutput", "load_model", "load_zoo_model"]

_ADAPTER_ATTR = "_decodekit_adapter"


def load_model(
    spec: Any,
    tokenizer: Any = None,
    *,
    dtype: torch.dtype | str | None = None,
    device: torch.device | str | None = None,
    kernels: str | None = None,
) -> LanguageModel:
    """Return a :class:`LanguageModel` for ``spec``.

    The adapter of a transformers model is made once and reused: ``load_model(m) is load_model(m)``, and
    :func:`decodekit.generate` called with the same model does not rebuild it. (Build ``HFCausalLM(m)`` directly
    for a fresh one, e.g. after replacing the model's output head.)

    Args:
        spec: a :class:`LanguageModel` (returned as is), a loaded transformers causal LM, a zoo name
            (a key of :data:`~decodekit.models.zoo.ZOO`, e.g. ``"smollm2-135m-instruct"``), or a local path
            to a causal LM (``from_pretrained``).
        tokenizer: the tokenizer to attach (loaded from the path when ``spec`` is a path); given for a model
            that already has an adapter, it replaces that adapter's tokenizer.
        dtype: optional dtype to cast the model to (``nn.Module.to``: a transformers model you pass is cast in
            place).
        device: optional device to move the model to (in place, likewise).
        kernels: optional CPU linear kernels, ``"onednn"`` (same float32 model, faster small-batch linears; the
            model you pass gets its ``nn.Linear`` layers replaced in place) or ``"int8"`` (a lossy int8 copy, for
            draft models; your model is left alone); see :mod:`decodekit.kernels.cpu`.

    Wrapping puts the model in ``eval()`` mode, switches attention implementations that cannot take decodekit's
    masks to ``sdpa`` (see :class:`HFCausalLM`), and records the adapter on the model (attribute
    ``_decodekit_adapter``, so it is found again and freed with the model); nothing else about your model changes.
    """
    if isinstance(spec, LanguageModel):
        if tokenizer is not None:
            spec.tokenizer = tokenizer
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
        spec = spec.to(parse_dtype(dtype))
    if device is not None:
        spec = spec.to(device)
    spec = apply_kernels(spec, kernels)
    adapter = spec.__dict__.get(_ADAPTER_ATTR)
    if adapter is None or kernels is not None:  # new kernels replace modules the old adapter captured
        adapter = HFCausalLM(spec, tokenizer=tokenizer)
        spec.__dict__[_ADAPTER_ATTR] = adapter
    elif tokenizer is not None:
        adapter.tokenizer = tokenizer
    return adapter
