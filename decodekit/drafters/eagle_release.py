"""EAGLE-1 / EAGLE-2 heads as their authors release them (``yuhuili/EAGLE-LLaMA3-Instruct-8B``,
``yuhuili/EAGLE-Vicuna-7B-v1.3``, ...): a directory holding ``config.json`` (the head's Llama config: the target's
sizes, ``num_hidden_layers: 1``, optionally ``bias`` and ``qkv_bias``) and ``pytorch_model.bin`` or
``model.safetensors`` with ``fc.weight`` / ``fc.bias`` (``[H, 2H]``: the token's embedding, then the feature) and
``layers.0.*`` (one Llama decoder layer; the released head has no input norm on it), optionally ``embed_tokens.weight``
(a copy of the target's, not used).

The head runs as the authors' ``cnets1.Model`` computes it: ``fc([embed(x_{t+1}) ; f_t])``, the decoder layer
without its input norm, no final norm, the target's own output head on the result (:class:`EagleHead` with those two
norms as identities). ``tests/unit/test_eagle.py`` checks the first round's draft against a port of that module on
a tiny target, and greedy output against plain decoding. ``.bin`` files are read with
``torch.load(weights_only=True)``: no pickled code runs. An EAGLE-3 release (``midlayer.*``, ``d2t``) in the same
directory layout is read as :class:`~decodekit.drafters.eagle3_head.Eagle3ReleaseHead`.

vLLM's ``speculators`` saved the same head, up to its 0.3 releases, as ``speculators_model_type: eagle``
(``EagleSpeculator``: EAGLE-1/2, and HASS with ``fusion_bias``): ``fusion_fc`` for ``fc``, ``transformer.*`` for
``layers.0.*``, the layer's Llama config under ``transformer_layer_config``, the verifier's embedding and output head
not stored; :func:`speculators_eagle` renames it to this layout (its ``layernorms=True`` variant, with norms this
head does not have, is refused).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

from decodekit.drafters.eagle3_head import default_layers
from decodekit.drafters.eagle3_release import build_release3, speculators_eagle3
from decodekit.drafters.eagle_head import EagleHead
from decodekit.drafters.head_files import check_release_sizes, load_tensors, on_target, target_config
from decodekit.drafters.lean_layer import lean_layer
from decodekit.errors import ConfigError
from decodekit.models.base import LanguageModel
from decodekit.models.checkpoint_files import read_state

WEIGHTS = ("model.safetensors", "pytorch_model.bin")
WHAT = "a released EAGLE head"
HINT = "pass the head released for this target (its config.json names the target's sizes)"


def is_release(path: str | Path) -> bool:
    """Whether ``path`` is a directory in the EAGLE authors' release layout (``config.json`` and a weights file)."""
    path = Path(path)
    return path.is_dir() and (path / "config.json").is_file() and any((path / w).is_file() for w in WEIGHTS)


def read_tensors(root: Path) -> dict[str, torch.Tensor]:
    """The release's tensors (:func:`~decodekit.models.checkpoint_files.read_state`)."""
    return read_state(next(root / w for w in WEIGHTS if (root / w).is_file()))


def load_release(
    path: str | Path, target: LanguageModel, *, lean: bool = True, bf16: bool | None = None
) -> tuple[Any, dict[str, Any]]:
    """The released EAGLE head at ``path`` for ``target`` and its metadata: ``{"release": "eagle" | "eagle3",
    "config": ...}``, and for EAGLE-3 the target ``layers`` it reads.

    Raises:
        ConfigError: a head whose config or tensors fit another target (the sizes named), a tensor missing or of
            another shape.
    """
    root = Path(path)
    config = json.loads((root / "config.json").read_text())
    tensors = read_tensors(root)
    hf_config = target_config(target, "eagle")
    kind = config.get("speculators_model_type")
    layers = config.get("eagle_aux_hidden_state_layer_ids")  # vLLM's key (decodekit's exports write it); None: default
    if kind == "eagle3":  # vLLM speculators' EAGLE-3: the authors' head under other names
        config, tensors, layers = speculators_eagle3(config, tensors)
    elif kind == "eagle":  # speculators' EAGLE-1/2 / HASS (its releases up to 0.3)
        config, tensors = speculators_eagle(config, tensors)
    elif kind is not None:
        raise ConfigError(
            f"{root} is a speculators {kind!r} checkpoint: decodekit reads speculators' EAGLE-3 and EAGLE / HASS heads "
            "and the EAGLE authors' own EAGLE-1/2 and EAGLE-3 releases"
        )
    if any(k.startswith("midlayer.") for k in tensors) or "d2t" in tensors:  # EAGLE-3's layout
        head3 = build_release3(root, config, tensors, target, len(layers) if layers else 3)
        head3 = on_target(head3, target, bf16)
        layers = list(layers or default_layers(target.num_layers))
        return head3, {"release": "eagle3", "config": config, "layers": layers}
    check_release_sizes(root, "EAGLE", config.get("hidden_size"), config.get("vocab_size"), target, HINT)
    unused = sorted(k for k in tensors if not k.startswith(("fc.", "layers.0.", "embed_tokens.")))
    if unused or int(config.get("num_hidden_layers") or 1) != 1:  # a head decodekit would run without them
        raise ConfigError(
            f"{root} is not the EAGLE-1/2 release layout decodekit reads (one decoder layer, fc, the target's "
            f"embeddings and output head): it has num_hidden_layers={config.get('num_hidden_layers', 1)}"
            + (f" and tensors {', '.join(unused[:6])}" if unused else "")
        )
    head = EagleHead(_head_config(hf_config, config))
    layer = head.decoder.layers[0]
    layer.input_layernorm, head.decoder.norm = nn.Identity(), nn.Identity()  # the release has neither
    state = {"fc.weight": tensors.get("fc.weight")}
    state["fc.bias"] = tensors.get("fc.bias", torch.zeros(head.fc.out_features))  # bias=False: a zero bias
    for key, value in tensors.items():
        if key.startswith("layers.0."):
            state["decoder." + key] = value
    if getattr(layer.self_attn.o_proj, "bias", None) is not None and "decoder.layers.0.self_attn.o_proj.bias" not in (
        state
    ):
        state["decoder.layers.0.self_attn.o_proj.bias"] = torch.zeros(head.fc.out_features)  # qkv_bias: none on o
    state = {k: v for k, v in state.items() if v is not None} | {"vocab": head.vocab}
    load_tensors(head, state, root, WHAT, "", skip="embed_tokens", advice=HINT)
    head = on_target(head, target, bf16)
    head.lean = lean_layer(head.decoder) if lean else None
    return head, {"release": "eagle", "config": config}


def speculators_eagle(config: dict[str, Any], tensors: dict[str, torch.Tensor]) -> tuple[dict, dict]:
    """A ``speculators`` EAGLE / HASS head (``speculators_model_type: eagle``) as the authors' EAGLE-1 layout: its
    layer's sizes from ``transformer_layer_config`` (``attention_bias`` as ``qkv_bias``: the o bias, if any, is read
    from the tensors), ``fusion_fc.*`` as ``fc.*`` (no ``fusion_bias``: a zero bias), ``transformer.*`` as
    ``layers.0.*``.

    Raises:
        ConfigError: ``layernorms=True`` (an embedding norm, the layer's input norm and a norm before the output head:
            not this head), or no ``transformer_layer_config``.
    """
    if config.get("layernorms"):
        raise ConfigError(
            "speculators EAGLE head with layernorms=True: not implemented (decodekit reads speculators' EAGLE / HASS "
            "heads without the extra embedding, input and output norms, as EAGLE-1/2 and HASS release them)"
        )
    layer = config.get("transformer_layer_config")
    if not isinstance(layer, dict):
        raise ConfigError("speculators EAGLE head without a transformer_layer_config: is the config.json complete?")
    keys = ("hidden_size", "vocab_size", "intermediate_size", "num_attention_heads", "num_key_value_heads")
    out = {key: layer.get(key) for key in (*keys, "rms_norm_eps")}
    out["rope_theta"] = layer.get("rope_theta") or (layer.get("rope_parameters") or {}).get("rope_theta")
    out["qkv_bias"] = bool(layer.get("attention_bias"))
    renames = (("fusion_fc.", "fc."), ("transformer.", "layers.0."))
    renamed = {}
    for key, value in tensors.items():
        for theirs, ours in renames:
            if key.startswith(theirs):
                key = ours + key.removeprefix(theirs)
        renamed[key] = value
    return out, renamed


def _head_config(target_config: Any, config: dict[str, Any]) -> Any:
    """The target's config with the release's layer settings: its sizes, norm epsilon, RoPE base and biases
    (``qkv_bias``: biases on q / k / v, held as Llama's ``attention_bias`` with a zero bias on o)."""
    import copy

    cfg = copy.deepcopy(target_config)
    for key in ("intermediate_size", "num_attention_heads", "num_key_value_heads", "rms_norm_eps"):
        if config.get(key) is not None:
            setattr(cfg, key, config[key])
    if config.get("rope_theta") is not None and isinstance(getattr(cfg, "rope_parameters", None), dict):
        cfg.rope_parameters = {**cfg.rope_parameters, "rope_theta": config["rope_theta"]}
    if config.get("qkv_bias"):
        cfg.attention_bias = True
    return cfg
