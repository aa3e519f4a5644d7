"""Which transformers models decodekit refuses, and why (``docs/supported-models.md`` has the full list).

A model is refused when decodekit cannot make its output equal the model's own: it is not a causal LM, it keeps
state outside the KV cache (recurrent, convolutional and linear-attention layers cannot roll back a rejected
draft), it builds position information from a 2-D padding mask instead of taking decodekit's 4-D mask (Bloom's
ALiBi), or its decoder cannot take explicit positions and a cache (decoders of encoder-decoder models, XLNet,
Reformer, GPT-1).
Every refusal is an :class:`~decodekit.errors.UnsupportedModelError` raised when the adapter is built, before any
compute. ``tests/unit/test_architectures.py`` checks every decoder-only architecture the pinned transformers can
build: each is either equal to ``model.generate`` token for token or refused here.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

import torch

from decodekit.errors import UnsupportedModelError

_STATE = "keeps recurrent or convolutional state outside the KV cache, which a rejected draft cannot roll back"
_ALIBI = "ALiBi position bias built from a 2-D padding mask; it cannot take decodekit's 4-D masks (trees, ragged rows)"

ENCODER_REASON = (
    "an encoder run as a decoder: its LM head transforms the hidden state before the output embedding and "
    "RoBERTa-style models offset their positions, which decodekit's adapter does not reproduce"
)

#: model type -> why decodekit refuses it (beyond the generic checks of :func:`check_supported`).
REFUSED: dict[str, str] = {
    "bloom": _ALIBI,
    **dict.fromkeys(
        (
            "bert",
            "big_bird",
            "camembert",
            "data2vec-text",
            "electra",
            "ernie",
            "megatron-bert",
            "rembert",
            "roberta",
            "roberta-prelayernorm",
            "roc_bert",
            "roformer",
            "xlm-roberta",
            "xlm-roberta-xl",
            "xmod",
            "modernbert-decoder",
        ),
        ENCODER_REASON,
    ),
}

#: model type -> why it runs chains only: its decoder takes no ``position_ids`` but derives everything from key
#: slots, which equal positions along a chain and not inside a token tree (scoring a tree raises).
CHAIN_ONLY: dict[str, str] = {
    "mpt": "ALiBi bias from key slots (slot == position on a chain, not inside a token tree)",
}


def _causal_lm_classes() -> set[str]:
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    names: set[str] = set()
    for value in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values():
        names.update(value if isinstance(value, (list, tuple)) else (value,))
    return names


def _parameters(module: torch.nn.Module) -> set[str]:
    try:
        return set(inspect.signature(type(module).forward).parameters)
    except (TypeError, ValueError):
        return set()


def cache_argument(decoder: torch.nn.Module) -> str | None:
    """The name under which ``decoder.forward`` takes its KV cache: ``"cache"`` (transformers >= 5.24),
    ``"past_key_values"`` (earlier releases), or None if it takes none."""
    parameters = _parameters(decoder)
    return next((name for name in ("cache", "past_key_values") if name in parameters), None)


def check_supported(model: torch.nn.Module, decoder: torch.nn.Module | None = None) -> None:
    """Raise :class:`UnsupportedModelError` naming the architecture and the reason if decodekit cannot run
    ``model`` exactly; return quietly otherwise (the attention pattern is checked by
    :func:`decodekit.models.hf_attention.attention_plan`).

    Args:
        model: the transformers model.
        decoder: its decoder stack (the module decodekit calls with ids, positions, mask and cache), if known:
            it must take ``position_ids`` and a cache (``cache``, or ``past_key_values`` before transformers 5.24).
    """
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
    if decoder is not None:
        parameters = _parameters(decoder)
        if cache_argument(decoder) is None:
            raise refuse(
                "its decoder takes no KV cache (cache / past_key_values), so decodekit cannot run it incrementally"
            )
        if "position_ids" not in parameters and model_type not in CHAIN_ONLY:
            raise refuse(
                "its decoder takes no position_ids (it derives positions from the cache length), so ragged rows and "
                "token trees would get wrong positions"
            )


LOGIT_SCALES: dict[
    str, tuple[str, bool]
] = {  # model type -> (config field, divide): what forward() does after the head
    **{t: ("logit_scale", False) for t in ("cohere", "cohere2", "cohere2_moe")},
    **{
        t: ("logits_scaling", True)
        for t in ("granite", "granite_swa", "granitemoe", "granitemoe_swa", "granitemoeshared", "minicpm3")
    },  # fmt: skip
    "hyperclovax": ("logits_scaling", False),
}


def logit_multiplier(config: Any) -> float | None:
    """The factor the model's own ``forward`` puts on its logits after the output head (Cohere's ``logit_scale``,
    Granite's and MiniCPM3's ``1 / logits_scaling``, HyperCLOVA X's ``logits_scaling``; :data:`LOGIT_SCALES`), or
    None: greedy decoding would not see it, but sampling, top-k and top-p would draw from another distribution."""
    field, divide = LOGIT_SCALES.get(getattr(config, "model_type", None), (None, False))
    value = getattr(config, field, None) if field else None
    if value is None or float(value) == 1.0:
        return None
    return 1.0 / float(value) if divide else float(value)


def rope_context(model: torch.nn.Module) -> int | None:
    """The context a model runs exactly with one KV cache where transformers' ``generate`` recomputes the whole cache
    at ``original_max_position_embeddings`` (Phi-3's and PhiMoE's ``longrope``: other rotary factors past it, so
    keys cached before it would be stale): that length when it is below the model's context, else None."""
    config = model.config
    original = getattr(config, "original_max_position_embeddings", None)
    longest = getattr(config, "max_position_embeddings", None)
    if not original or not longest or int(original) >= int(longest) or not _recomputes(type(model)):
        return None
    return int(original)


@functools.cache
def _recomputes(cls: type) -> bool:
    """Whether ``cls.prepare_inputs_for_generation`` drops the cache at ``original_max_position_embeddings``."""
    method = getattr(cls, "prepare_inputs_for_generation", None)
    try:
        return "original_max_position_embeddings" in inspect.getsource(method)
    except (OSError, TypeError):
        return False
