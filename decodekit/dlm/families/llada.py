"""LLaDA (Nie et al. 2025; ``GSAI-ML/LLaDA-8B-Base`` / ``-Instruct``, LLaDA-1.5) as transformers' Llama.

The released checkpoints use the OLMo-derived ``LLaDAModelLM`` (``model_type: llada``, ``block_type: llama``):
per block ``x + attn_out(attn(q_proj, k_proj, v_proj of attn_norm(x)))``, then ``+ ff_out(silu(ff_proj(h)) *
up_proj(h))`` on ``h = ff_norm(x)``; RMS norms, rotary embeddings (rotate-half, ``rope_theta``), ``ln_f``, and an
output layer ``transformer.ff_out`` (or the tied embedding). That is transformers' Llama block one for one, so the
checkpoint's tensors load into ``LlamaForCausalLM`` renamed; attention is made bidirectional by the 4-D masks
:class:`~decodekit.dlm.DLMModel` passes. Logits are not shifted; the mask token is ``config.json``'s
``mask_token_id`` (126336 in every release).

Checked against the reference: ``tests/unit/test_dlm_families.py`` compares logits and LLaDA's low-confidence
``generate`` (temperature 0) with a port of ``modeling_llada.py`` as NVlabs/Fast-dLLM vendors it (@ 24cc59e, whose
non-cached forward is LLaDA's own) on tiny random checkpoints written in this layout; the port itself gave that
file's logits exactly on those checkpoints (float32; decodekit's are within 2e-5 of them). Settings the released models
do not use (other block types, ALiBi, biases, logit scaling, grouped blocks, ...) are refused by name.
"""

from __future__ import annotations

from typing import Any

from decodekit.dlm.families import Family, mask_from
from decodekit.errors import UnsupportedModelError

__all__ = ["LLADA"]

MASK_TOKEN_ID = 126336  # LLaDA's [MASK] (``mask_token_id`` in every released config.json)

# setting -> (the value decodekit implements, as LLaDA-8B / 1.5 set it; ModelConfig's default when a config.json
# leaves the key out)
REQUIRED = {
    "block_type": ("llama", "sequential"),
    "activation_type": ("silu", "swiglu"),
    "layer_norm_type": ("rms", "default"),
    "layer_norm_with_affine": (True, True),
    "rope": (True, False),
    "alibi": (False, False),
    "scale_logits": (False, False),
    "input_emb_norm": (False, False),
    "attention_layer_norm": (False, False),
    "block_group_size": (1, 1),
    "include_bias": (False, False),
    "include_qkv_bias": (False, False),
    "bias_for_layer_norm": (False, None),  # None: follows include_bias
}
DEFAULTS = {
    "rope_theta": 10000.0,
    "rms_norm_eps": 1e-5,
    "max_sequence_length": 1024,
    "weight_tying": True,
    "mlp_ratio": 4,
}
# LLaDALlamaBlock's tensor -> LlamaDecoderLayer's
BLOCK = {
    "attn_norm": "input_layernorm",
    "q_proj": "self_attn.q_proj",
    "k_proj": "self_attn.k_proj",
    "v_proj": "self_attn.v_proj",
    "attn_out": "self_attn.o_proj",
    "ff_norm": "post_attention_layernorm",
    "ff_proj": "mlp.gate_proj",
    "up_proj": "mlp.up_proj",
    "ff_out": "mlp.down_proj",
}


def convert(config: dict[str, Any]) -> tuple[Any, dict[str, str]]:
    """LLaDA's ``config.json`` -> a ``LlamaConfig`` and ``{Llama parameter: LLaDA tensor}``."""
    from transformers import LlamaConfig

    get = {**DEFAULTS, **{key: default for key, (_, default) in REQUIRED.items()}, **config}.get
    for key, (want, _) in REQUIRED.items():
        have = get(key)
        if key == "bias_for_layer_norm" and have is None:  # follows include_bias, False above
            continue
        if have != want:
            raise UnsupportedModelError(
                f"LLaDA checkpoint with {key}={have!r}: decodekit reads LLaDA's released layout ({key}={want!r}); "
                "this variant's blocks are not implemented"
            )
    for key in ("d_model", "n_heads", "n_layers"):
        if get(key) is None:
            raise UnsupportedModelError(f"LLaDA config.json has no {key!r}: is this a LLaDA checkpoint?")
    heads = int(get("n_heads"))
    kv_heads = get("n_kv_heads") or (1 if get("multi_query_attention") else heads)
    vocab = int(get("embedding_size") or get("vocab_size"))
    tied = bool(get("weight_tying"))
    hf_config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=int(get("d_model")),
        intermediate_size=int(get("mlp_hidden_size") or get("mlp_ratio") * get("d_model")),
        num_hidden_layers=int(get("n_layers")),
        num_attention_heads=heads,
        num_key_value_heads=int(kv_heads),
        hidden_act="silu",
        max_position_embeddings=int(get("max_sequence_length")),
        rms_norm_eps=float(get("rms_norm_eps")),
        rope_theta=float(get("rope_theta")),
        tie_word_embeddings=tied,
        attention_bias=False,
        mlp_bias=False,
        eos_token_id=get("eos_token_id"),
        pad_token_id=get("pad_token_id"),
        bos_token_id=None,
    )
    prefix = "model.transformer"
    sources = {"model.embed_tokens.weight": f"{prefix}.wte.weight", "model.norm.weight": f"{prefix}.ln_f.weight"}
    if not tied:
        sources["lm_head.weight"] = f"{prefix}.ff_out.weight"
    for i in range(hf_config.num_hidden_layers):
        for theirs, ours in BLOCK.items():
            sources[f"model.layers.{i}.{ours}.weight"] = f"{prefix}.blocks.{i}.{theirs}.weight"
    return hf_config, sources


LLADA = Family(
    name="LLaDA",
    model_types=("llada",),
    architectures=("LLaDAModelLM",),
    convert=convert,
    mask_token_id=mask_from(MASK_TOKEN_ID, ask_tokenizer=False),
    shift_logits=False,
)
