"""The checks of a model argument and a device argument, beside the loaders that take them: :func:`parse_device`
(a device that exists on this machine) and :func:`check_model_spec` (what :func:`~decodekit.load_model` can take).
Like every check of :mod:`decodekit.checks`, from where both are also importable (on first use there: this package
imports that module), they raise a :class:`~decodekit.errors.ConfigError` naming the argument."""

from __future__ import annotations

import os
from typing import Any

import torch

from decodekit.checks import describe, is_int
from decodekit.errors import ConfigError, ConfigTypeError

__all__ = ["check_model_spec", "parse_device"]


def parse_device(name: str, device: Any) -> torch.device:
    """``device`` (a ``torch.device``, a string such as ``"cpu"`` / ``"cuda:0"``, or a CUDA index) as a
    ``torch.device`` that exists on this machine.

    Raises:
        ConfigTypeError: not a device, a string or an integer.
        ConfigError: an unknown device string, or a device this machine does not have.
    """
    if isinstance(device, torch.device):
        resolved = device
    elif isinstance(device, str) or is_int(device):
        try:
            resolved = torch.device(device if isinstance(device, str) else int(device))
        except (RuntimeError, ValueError, TypeError):
            raise ConfigError(
                f"{name} must be a device such as 'cpu', 'cuda', 'cuda:0' or 'mps', got {describe(device)}"
            ) from None
    else:
        raise ConfigTypeError(
            f"{name} must be a torch.device or a device string such as 'cpu' or 'cuda:0', got {describe(device)}"
        )
    if resolved.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise ConfigError(f"{name}={device!r} but CUDA is not available on this machine; use {name}='cpu'")
        if resolved.index is not None and resolved.index >= count:
            raise ConfigError(
                f"{name}={device!r} but this machine has {count} CUDA device(s): use cuda:0 .. cuda:{count - 1}"
            )
    elif resolved.type == "mps" and not torch.backends.mps.is_available():
        raise ConfigError(f"{name}={device!r} but MPS is not available on this machine; use {name}='cpu'")
    return resolved


def check_model_spec(name: str, spec: Any) -> None:
    """Refuse a model argument that :func:`~decodekit.load_model` cannot take: anything but a decodekit
    ``LanguageModel``, a transformers causal LM instance (an ``nn.Module`` with ``get_decoder()`` and
    ``get_output_embeddings()``; a plain ``nn.Module`` is refused), a zoo name or a local path."""
    from decodekit.models.base import LanguageModel

    if isinstance(spec, torch.nn.Module) and not isinstance(spec, LanguageModel):
        if not all(callable(getattr(spec, m, None)) for m in ("get_decoder", "get_output_embeddings")):
            raise ConfigTypeError(
                f"{name} must be a transformers causal LM (a PreTrainedModel with get_decoder() and an output head, "
                f"e.g. LlamaForCausalLM), a decodekit LanguageModel, a zoo name or a local path; got "
                f"{describe(spec)}, a torch.nn.Module that is not a causal LM"
            )
        return
    if isinstance(spec, (LanguageModel, str, os.PathLike)):
        return
    if isinstance(spec, type):
        raise ConfigTypeError(
            f"{name} must be a model instance, got the class {spec.__name__}; pass a loaded model (e.g. "
            f"{spec.__name__}.from_pretrained(path)), a zoo name or a local path"
        )
    raise ConfigTypeError(
        f"{name} must be a decodekit LanguageModel, a transformers causal LM, a zoo name or a local path, "
        f"got {describe(spec)}"
    )
