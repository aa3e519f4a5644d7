"""EAGLE-3 heads as their authors release them (``yuhuili/EAGLE3-LLaMA3.1-Instruct-8B`` and the like): a directory
holding ``config.json`` (the head's Llama config: the target's sizes, ``num_hidden_layers: 1``, ``draft_vocab_size``,
optionally ``target_hidden_size``) and ``pytorch_model.bin`` or ``model.safetensors`` with ``fc.weight``
(``[H, 3H_t]``: the target's three layers fused), ``midlayer.*`` (the decoder layer), ``norm.weight``,
``lm_head.weight`` (``[V_d, H]``, its own output layer over the draft vocabulary) and ``d2t`` (draft id ``d`` is
target id ``d + d2t[d]``); vLLM's ``speculators`` layout of the same head (:func:`speculators_eagle3`); and the
``config.json`` such a head is written with (:func:`head_config`).

The files become an :class:`~decodekit.drafters.eagle3_head.Eagle3ReleaseHead` (:func:`build_release3`), the module
the authors' ``cnets.Model`` computes. ``tests/unit/test_eagle.py`` checks the first round's draft against a port of
that module and greedy output against plain decoding.
"""

from __future__ import annotations

from typing import Any

import torch

from decodekit.drafters.eagle3_head import Eagle3ReleaseHead
from decodekit.drafters.head_files import check_release_sizes, target_config
from decodekit.errors import ConfigError
from decodekit.models.base import LanguageModel

# the release's tensor -> Eagle3ReleaseHead's
NAMES = {
    "fc.weight": "fuse.weight",
    "norm.weight": "norm.weight",
    "lm_head.weight": "lm_head.weight",
    "midlayer.hidden_norm.weight": "hidden_norm.weight",
    "midlayer.input_layernorm.weight": "input_norm.weight",
    "midlayer.post_attention_layernorm.weight": "post_norm.weight",
    **{f"midlayer.self_attn.{p}.weight": f"{p}.weight" for p in ("q_proj", "k_proj", "v_proj", "o_proj")},
    **{f"midlayer.mlp.{p}.weight": f"{p}.weight" for p in ("gate_proj", "up_proj", "down_proj")},
}


DROPPED = ("architectures", "model_type", "rope_scaling", "rope_theta", "norm_before_residual", "target_hidden_size")


def speculators_eagle3(config: dict[str, Any], tensors: dict[str, torch.Tensor]) -> tuple[dict, dict, list | None]:
    """A vLLM ``speculators`` EAGLE-3 checkpoint (``speculators_model_type: eagle3``) as the authors' layout: its
    ``transformer_layer_config`` with the head's own keys, ``layers.0.*`` renamed ``midlayer.*``, and the target
    layers it names (``eagle_aux_hidden_state_layer_ids``; None: the authors' default).

    Raises:
        ConfigError: a normalisation variant this head does not implement (``norm_before_fc``, ``fc_norm``,
            ``norm_output``), named.
    """
    variants = [key for key in ("norm_before_fc", "fc_norm", "norm_output") if config.get(key)]
    if variants:
        raise ConfigError(
            f"speculators EAGLE-3 head with {', '.join(f'{k}=True' for k in variants)}: not implemented (decodekit "
            "reads the EAGLE-3 head with norm_before_residual either way, and no other normalisation)"
        )
    layer = dict(config.get("transformer_layer_config") or {})
    if int(layer.get("num_hidden_layers", 1)) != 1:
        raise ConfigError(
            f"speculators EAGLE-3 head with {layer['num_hidden_layers']} decoder layers (transformer_layer_config."
            "num_hidden_layers): decodekit reads the one-layer head"
        )
    merged = {**layer, **{k: config[k] for k in ("draft_vocab_size", "norm_before_residual", "target_hidden_size")
                          if config.get(k) is not None}}  # fmt: skip
    merged["vocab_size"] = layer.get("vocab_size")
    renamed = {("midlayer." + k.removeprefix("layers.0.")) if k.startswith("layers.0.") else k: v
               for k, v in tensors.items()}  # fmt: skip
    return merged, renamed, config.get("eagle_aux_hidden_state_layer_ids")


def head_config(target_config: Any, draft_vocab: int | None = None) -> dict[str, Any]:
    """The ``config.json`` of an EAGLE-3 head, in its authors' keys, for a target with the transformers config
    ``target_config``: the target's sizes, norm epsilon and RoPE, one layer, ``draft_vocab`` output rows (None:
    no ``draft_vocab_size`` key, the head's ``lm_head`` says)."""
    heads = int(target_config.num_attention_heads)
    rope = dict(getattr(target_config, "rope_parameters", None) or {})
    theta = rope.pop("rope_theta", getattr(target_config, "rope_theta", 10000.0))
    rope_type = rope.pop("rope_type", "default")
    return {
        "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_act": "silu",
        "hidden_size": int(target_config.hidden_size), "intermediate_size": int(target_config.intermediate_size),
        "num_attention_heads": heads, "num_key_value_heads": int(target_config.num_key_value_heads or heads),
        "head_dim": int(getattr(target_config, "head_dim", None) or target_config.hidden_size // heads),
        "rms_norm_eps": float(getattr(target_config, "rms_norm_eps", 1e-6)), "rope_theta": float(theta),
        "rope_scaling": None if rope_type == "default" else {"rope_type": rope_type, **rope},
        "max_position_embeddings": int(target_config.max_position_embeddings), "num_hidden_layers": 1,
        "vocab_size": int(target_config.vocab_size), "tie_word_embeddings": False,
    } | ({} if draft_vocab is None else {"draft_vocab_size": int(draft_vocab)})  # fmt: skip


def llama_config(config: dict[str, Any]) -> Any:
    """The transformers ``LlamaConfig`` of a head's ``config.json`` (the authors' keys: ``rope_theta`` and
    ``rope_scaling`` become transformers 5's ``rope_parameters``)."""
    from transformers import LlamaConfig

    settings = {k: v for k, v in config.items() if k not in DROPPED}
    scaling = dict(config.get("rope_scaling") or {})
    rope_type = scaling.pop("rope_type", scaling.pop("type", "default"))
    return LlamaConfig(**settings, rope_parameters={**scaling, "rope_type": rope_type,
                                                    "rope_theta": config.get("rope_theta", 10000.0)})  # fmt: skip


def draft_vocab(root: Any, d2t: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """The target id of each draft id, ``[V_d]``, from a release's ``d2t`` (offsets: target id = draft id +
    ``d2t[draft id]``, as the EAGLE-3 authors' training code writes them, and DFlash's releases after them). Refuses a
    ``d2t`` that does not map to distinct target ids in ``[0, vocab_size)``, ascending: absolute ids stored there
    would draft wrong tokens or fail deep in a forward."""
    ids = torch.arange(len(d2t)) + d2t.long()
    if d2t.dim() != 1 or (len(ids) and (ids.min() < 0 or ids.max() >= vocab_size or (ids.diff() <= 0).any())):
        raise ConfigError(
            f"{root}'s d2t does not map the draft vocabulary to distinct target ids in [0, {vocab_size}), ascending: "
            "it must hold offsets (target id - draft id), as the EAGLE-3 authors' training code writes it"
        )
    return ids


def build_release3(
    root: Any, config: dict[str, Any], tensors: dict[str, torch.Tensor], target: LanguageModel, taps: int = 3
) -> Eagle3ReleaseHead:
    """The head of an EAGLE-3 release for ``target`` (``fc`` fusing ``taps`` target layers); refuses one for another
    target (sizes named)."""
    hf_config = target_config(target, "eagle3")
    hidden = int(config.get("target_hidden_size") or hf_config.hidden_size)
    check_release_sizes(root, "EAGLE-3", hidden, config.get("vocab_size"), target)
    if "lm_head.weight" not in tensors:
        raise ConfigError(f"{root} lacks 'lm_head.weight': not an EAGLE-3 head")
    if "d2t" not in tensors:  # no draft vocabulary map: the draft vocabulary is the target's
        if tensors["lm_head.weight"].shape[0] != target.vocab_size:
            raise ConfigError(f"{root} lacks 'd2t', and its draft vocabulary is not the target's: not an EAGLE-3 head")
        tensors = {**tensors, "d2t": torch.zeros(target.vocab_size, dtype=torch.long)}
    unused = sorted(
        k for k in tensors if k not in NAMES and k not in ("d2t", "t2d") and not k.startswith("embed_tokens.")
    )
    if unused:  # biases, a second layer, ...: a head decodekit would run without them, silently less accepted
        raise ConfigError(
            f"{root} holds tensors the released EAGLE-3 head has no place for: {', '.join(unused[:6])}; decodekit runs "
            "the authors' one-layer head without attention biases (attention_bias: true or more layers are not read)"
        )
    vocab = draft_vocab(root, tensors["d2t"], target.vocab_size)
    if len(vocab) != tensors["lm_head.weight"].shape[0]:
        raise ConfigError(
            f"{root}'s d2t maps {len(vocab)} draft ids, its lm_head has {tensors['lm_head.weight'].shape[0]} rows: "
            "they must be one per draft id"
        )
    before = bool(config.get("norm_before_residual", False))
    head = Eagle3ReleaseHead(llama_config(config), int(tensors["lm_head.weight"].shape[0]), taps * hidden, before)
    expected = head.state_dict()
    problems = [f"{src!r} is missing" for src in NAMES if src not in tensors]
    problems += [
        f"{src!r} has shape {list(tensors[src].shape)}, this target's head needs {list(expected[dst].shape)}"
        for src, dst in NAMES.items()
        if src in tensors and tensors[src].shape != expected[dst].shape
    ]
    if problems:
        raise ConfigError(f"{root} does not fit a released EAGLE-3 head for this target: {'; '.join(problems[:4])}")
    head.load_state_dict({dst: tensors[src] for src, dst in NAMES.items()}, strict=False)
    head.vocab = vocab
    return head
