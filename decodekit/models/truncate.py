"""Layer truncation: a draft model cut from a target, made of the target's first decoder layers."""

from __future__ import annotations

import copy
from typing import Any

import torch

from decodekit.errors import ConfigError
from decodekit.models.base import check_layer

__all__ = ["check_num_layers", "truncate_layers"]


def check_num_layers(num_layers: object, total: int, owner: str) -> None:
    """Refuse a layer count that is not an integer in ``[1, total]``.

    Raises:
        ConfigError: naming the valid range and ``owner`` (the model the count is for).
    """
    check_layer(num_layers, 1, total, "num_layers must be an integer", f" for {owner}")


def truncate_layers(hf_model: torch.nn.Module, num_layers: int, *, share_weights: bool = True) -> torch.nn.Module:
    """A separate model made of the first ``num_layers`` decoder layers of ``hf_model`` (plus its embeddings,
    final norm and LM head): a cheap draft model with exactly the target's vocabulary.

    Works for transformers models whose decoder keeps its blocks in ``.layers`` (Llama, Mistral, Qwen2/3, ...).
    ``hf_model`` is not modified. The copy is a new module tree with its own config (``num_hidden_layers`` and
    per-layer lists such as ``layer_types`` cut to ``num_layers``).

    Args:
        hf_model: a transformers causal LM.
        num_layers: decoder layers to keep, ``1 .. num_hidden_layers``.
        share_weights: True (default) = the copy's parameters are new ``Parameter`` objects over the same
            storage (no extra memory; ``.to(dtype/device)`` on either model leaves the other alone, but in-place
            weight updates, e.g. training, show in both). False = cloned weights (train the draft freely).

    Raises:
        ConfigError: ``num_layers`` out of range, or a model without ``decoder.layers``.
    """
    decoder = hf_model.get_decoder() if hasattr(hf_model, "get_decoder") else getattr(hf_model, "model", None)
    layers = getattr(decoder, "layers", None)
    if not isinstance(layers, torch.nn.ModuleList):
        raise ConfigError(
            f"truncate_layers needs a decoder with a `.layers` ModuleList (Llama-style); "
            f"{type(hf_model).__name__} has none"
        )
    check_num_layers(num_layers, len(layers), "this model")

    # Deep copy with a pre-filled memo: kept parameters map to new Parameters (shared or cloned storage; tied
    # weights stay tied since they are one object), dropped layers map to None and are never copied.
    memo: dict[int, Any] = {id(layer): None for layer in layers[num_layers:]}
    dropped = {id(p) for layer in layers[num_layers:] for p in layer.parameters()}
    for p in hf_model.parameters():
        if id(p) not in dropped:
            data = p.detach() if share_weights else p.detach().clone()
            memo[id(p)] = torch.nn.Parameter(data, requires_grad=p.requires_grad)
    truncated = copy.deepcopy(hf_model, memo)
    new_decoder = truncated.get_decoder() if hasattr(truncated, "get_decoder") else truncated.model
    new_decoder.layers = torch.nn.ModuleList(list(new_decoder.layers)[:num_layers])
    configs = [truncated.config]
    if getattr(new_decoder, "config", None) is not None and new_decoder.config is not truncated.config:
        configs.append(new_decoder.config)  # e.g. a text_config inside a multimodal config
    for config in configs:
        config.num_hidden_layers = num_layers
        if isinstance(getattr(config, "layer_types", None), list):
            config.layer_types = config.layer_types[:num_layers]
    return truncated
