"""The conversion the Qwen-derived families share: their checkpoints keep transformers' own Qwen2 / Qwen3 parameter
names (Dream, Fast-dLLM v2: Qwen2; SDAR: Qwen3), so a family only names its config class and what it refuses."""

from __future__ import annotations

from typing import Any

from decodekit.errors import UnsupportedModelError

KEYS = (  # keys the families' own configs share with Qwen2Config / Qwen3Config, with the same meaning
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "max_position_embeddings",
    "rms_norm_eps",
    "tie_word_embeddings",
    "attention_bias",
    "eos_token_id",
    "pad_token_id",
    "bos_token_id",
)
MLP = [*(f"mlp.{p}_proj.weight" for p in ("gate", "up", "down")), "input_layernorm.weight",
       "post_attention_layernorm.weight"]  # fmt: skip


def convert_qwen(config: dict[str, Any], family: str, qwen3: bool = False) -> tuple[Any, dict[str, str]]:
    """A Qwen-derived family's ``config.json`` -> a ``Qwen2Config`` (``qwen3``: ``Qwen3Config``, with per-head q / k
    norms and ``attention_bias`` on all four projections) and ``{parameter: checkpoint tensor}`` (the same names).

    Raises:
        UnsupportedModelError: sliding-window layers (a diffusion LM attends over its whole canvas), another
            activation than SiLU, or a config without the decoder's sizes; each named with ``family``.
    """
    from transformers import Qwen2Config, Qwen3Config

    sliding = config.get("use_sliding_window") or "sliding_attention" in (config.get("layer_types") or ())
    if sliding:
        raise UnsupportedModelError(
            f"{family} checkpoint with sliding-window layers (use_sliding_window / layer_types): a diffusion LM "
            f"attends over the whole canvas; decodekit runs {family}'s released layout (full attention everywhere)"
        )
    if config.get("hidden_act", "silu") != "silu":
        raise UnsupportedModelError(
            f"{family} checkpoint with hidden_act={config['hidden_act']!r}: {family} uses 'silu'"
        )
    for key in ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size"):
        if key not in config:
            raise UnsupportedModelError(f"{family} config.json has no {key!r}: is this a {family} checkpoint?")
    scaling = dict(config.get("rope_scaling") or {})  # transformers 5 calls it rope_parameters, with the theta
    rope_type = scaling.pop("rope_type", scaling.pop("type", "default"))  # "type": the older spelling
    rope = {**scaling, "rope_type": rope_type, "rope_theta": config.get("rope_theta", 10000.0)}
    keys = {key: config[key] for key in KEYS if config.get(key) is not None}
    if not qwen3:
        keys.pop("attention_bias", None)  # Qwen2: biases on q / k / v always, none on o
    cls = Qwen3Config if qwen3 else Qwen2Config
    hf_config = cls(**keys, rope_parameters=rope, hidden_act="silu", use_sliding_window=False)
    sources = {name: name for name in ("model.embed_tokens.weight", "model.norm.weight")}
    if not hf_config.tie_word_embeddings:
        sources["lm_head.weight"] = "lm_head.weight"
    attention = [f"self_attn.{p}_proj.weight" for p in "qkvo"]
    if qwen3:
        attention += ["self_attn.q_norm.weight", "self_attn.k_norm.weight"]
        if hf_config.attention_bias:
            attention += [f"self_attn.{p}_proj.bias" for p in "qkvo"]
    else:
        attention += [f"self_attn.{p}_proj.bias" for p in "qkv"]
    for i in range(hf_config.num_hidden_layers):
        sources |= {f"model.layers.{i}.{name}": f"model.layers.{i}.{name}" for name in attention + MLP}
    return hf_config, sources
