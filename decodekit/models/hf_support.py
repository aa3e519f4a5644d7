"""Which transformers models decodekit refuses, and why (``docs/supported-models.md`` has the full list).

A model is refused when decodekit cannot make its output equal the model's own: it is not a causal LM, it keeps
state outside the KV cache (recurrent, convolutional and linear-attention layers cannot roll back a rejected
draft), or it builds position information from a 2-D padding mask instead of taking decodekit's 4-D mask (ALiBi).
Every refusal is an :class:`~decodekit.errors.UnsupportedModelError` raised when the adapter is built, before any
compute. ``tests/unit/test_architectures.py`` checks every decoder-only architecture the pinned transformers can
build: each is either equal to ``model.generate`` token for token or refused here.
"""

from __future__ import annotations

from typing import Any

import torch

from decodekit.errors import UnsupportedModelError

_STATE = "keeps recurrent or convolutional state outside the KV cache, which a rejected draft cannot roll back"
_ALIBI = "ALiBi position bias built from a 2-D padding mask; it cannot take decodekit's 4-D masks (trees, ragged rows)"

#: model type -> why decodekit refuses it (beyond the generic checks of :func:`check_supported`).
REFUSED: dict[str, str] = {
    "bloom": _ALIBI,
    "mpt": _ALIBI,
}


def _causal_lm_classes() -> set[str]:
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    names: set[str] = set()
    for value in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values():
        names.update(value if isinstance(value, (list, tuple)) else (value,))
    return names


def check_supported(model: torch.nn.Module) -> None:
    """Raise :class:`UnsupportedModelError` naming the architecture and the reason if decodekit cannot run
    ``model`` exactly; return quietly otherwise (the attention pattern is checked by
    :func:`decodekit.models.hf_attention.attention_plan`)."""
    config: Any = getattr(model, "config", None)
    name = type(model).__name__
    model_type = getattr(config, "model_type", None) or "?"

    def refuse(reason: str) -> UnsupportedModelError:
        return UnsupportedModelError(
            f"{name} (model type {model_type!r}) is not supported: {reason}. See docs/supported-models.md"
        )

    if config is None:
        raise refuse("it has no transformers config; wrap it in a decodekit LanguageModel adapter instead")
    if getattr(config, "is_encoder_decoder", False):
        raise refuse("an encoder-decoder model; decodekit runs decoder-only causal LMs")
    if name.startswith(("Auto", "PreTrained")) or (
        name not in _causal_lm_classes() and not name.endswith(("ForCausalLM", "LMHeadModel"))
    ):
        raise refuse("not a causal language model (load it with AutoModelForCausalLM)")
    if getattr(model, "_is_stateful", False):
        raise refuse(_STATE)
    if getattr(config, "alibi", False):
        raise refuse(_ALIBI)
    if model_type in REFUSED:
        raise refuse(REFUSED[model_type])
