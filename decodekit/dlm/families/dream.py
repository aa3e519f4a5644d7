"""Dream (Ye et al. 2025; ``Dream-org/Dream-v0-Base-7B`` / ``-Instruct-7B``) as transformers' Qwen2, bidirectional.

The released checkpoints (``model_type: Dream``, ``DreamModel``) are Qwen2 decoders initialised from Qwen2.5 and
trained as masked diffusion LMs: the same parameter names as ``Qwen2ForCausalLM`` (biases on q / k / v only), RMS
norms, rotary embeddings (``rope_theta``, ``rope_scaling``), attention made bidirectional (``is_causal = False``; here
by the 4-D masks :class:`~decodekit.dlm.DLMModel` passes). Its ``diffusion_generate`` reads slot ``j``'s logits at
position ``j - 1`` (shifted), and the mask token is ``config.json``'s ``mask_token_id`` (151666). Its tokenizer
is a Qwen2 byte-level BPE (``vocab.json`` / ``merges.txt``) behind the repository's own ``DreamTokenizer`` class:
read with transformers' ``Qwen2Tokenizer`` when no other class loads it.

Checked against the reference: ``tests/unit/test_dlm_families.py`` compares logits with a port of
``modeling_dream.py`` as NVlabs/Fast-dLLM vendors it (@ 24cc59e; the port gave that file's logits on the tiny
checkpoints, exactly in float32), and its ``diffusion_generate`` at temperature 0 with
:class:`~decodekit.dlm.DreamRule` (``alg`` ``maskgit_plus``, ``topk_margin``, ``entropy``) with a port of its
``_sample``: the same tokens. Its default ``alg="origin"`` draws the slots to commit with ``torch.rand`` and is not
implemented.
"""

from __future__ import annotations

from typing import Any

from decodekit.dlm.families import Family
from decodekit.errors import UnsupportedModelError

__all__ = ["DREAM"]

MASK_TOKEN_ID = 151666  # Dream's <|mask|> (``mask_token_id`` in the released config.json)
LAYER = [
    *(f"self_attn.{p}_proj.{w}" for p in "qkv" for w in ("weight", "bias")),
    "self_attn.o_proj.weight",
    *(f"mlp.{p}_proj.weight" for p in ("gate", "up", "down")),
    "input_layernorm.weight",
    "post_attention_layernorm.weight",
]
KEYS = (  # DreamConfig's own keys that mean the same in Qwen2Config
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "max_position_embeddings",
    "rms_norm_eps",
    "tie_word_embeddings",
    "eos_token_id",
    "pad_token_id",
    "bos_token_id",
)


def convert(config: dict[str, Any]) -> tuple[Any, dict[str, str]]:
    """Dream's ``config.json`` -> a ``Qwen2Config`` and ``{Qwen2 parameter: Dream tensor}`` (the same names)."""
    from transformers import Qwen2Config

    if config.get("use_sliding_window"):
        raise UnsupportedModelError(
            "Dream checkpoint with use_sliding_window=True: a diffusion LM attends over the whole canvas; decodekit "
            "runs Dream's released layout (use_sliding_window=False)"
        )
    if config.get("hidden_act", "silu") != "silu":
        raise UnsupportedModelError(f"Dream checkpoint with hidden_act={config['hidden_act']!r}: Dream uses 'silu'")
    for key in ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size"):
        if key not in config:
            raise UnsupportedModelError(f"Dream config.json has no {key!r}: is this a Dream checkpoint?")
    scaling = dict(config.get("rope_scaling") or {})  # transformers 5 calls it rope_parameters, with the theta
    rope_type = scaling.pop("rope_type", scaling.pop("type", "default"))  # "type": the older spelling
    rope = {**scaling, "rope_type": rope_type, "rope_theta": config.get("rope_theta", 10000.0)}
    hf_config = Qwen2Config(
        **{key: config[key] for key in KEYS if key in config},
        rope_parameters=rope,
        hidden_act="silu",
        use_sliding_window=False,
    )
    sources = {name: name for name in ("model.embed_tokens.weight", "model.norm.weight")}
    if not hf_config.tie_word_embeddings:
        sources["lm_head.weight"] = "lm_head.weight"
    for i in range(hf_config.num_hidden_layers):
        sources |= {f"model.layers.{i}.{name}": f"model.layers.{i}.{name}" for name in LAYER}
    return hf_config, sources


def tokenizer(root: Any) -> Any:
    """Dream's Qwen2 BPE files read by transformers' ``Qwen2Tokenizer`` (its special tokens from
    ``tokenizer_config.json``), for when no transformers class named by the checkpoint loads it."""
    from transformers import Qwen2Tokenizer

    return Qwen2Tokenizer.from_pretrained(str(root), local_files_only=True)


DREAM = Family(
    name="Dream",
    model_types=("Dream",),
    architectures=("DreamModel",),
    convert=convert,
    mask_token_id=lambda config: int(config.get("mask_token_id") or MASK_TOKEN_ID),
    shift_logits=True,
    tokenizer=tokenizer,
)
