"""Tiny random models of every decoder-only architecture the installed transformers can build from a config.

``CASES`` lists ``(model_type, variant)`` pairs from ``MODEL_FOR_CAUSAL_LM_MAPPING_NAMES``; :func:`tiny_model` builds
one: float32, 2 decoder layers (or one layer of each kind for models that mix layer kinds), vocabulary 128, hidden
size 64, EOS/BOS/PAD ids off, sliding windows of 8 tokens, seeded weights. No files, no network.
``SKIPPED`` says why an architecture of the mapping is not a case, and ``EXPECTED`` whether decodekit must run a
case exactly (``"supported"``) or refuse it up front (``"refused"``).
"""

from __future__ import annotations

import dataclasses
import functools
import warnings
from typing import Any

import torch
from transformers import CONFIG_MAPPING, AutoModelForCausalLM, GenerationConfig
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

from decodekit.models.hf_support import ENCODER_REASON, REFUSED

VOCAB = 128
WINDOW = 8  # sliding / local attention window, shorter than every prompt + output the sweep runs
MAX_PARAMS = 3_000_000  # a tiny model; anything bigger means an override is missing

# Canonical small settings, and the other names configs give the same thing (first match wins per field).
SMALL: dict[str, Any] = {
    "vocab_size": VOCAB,
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "intermediate_size": 64,
    "max_position_embeddings": 256,
    "initializer_range": 0.2,  # peaked next-token distributions: few near-ties between the top two logits
    "bos_token_id": None,
    "eos_token_id": None,
    "pad_token_id": None,
    "is_decoder": True,  # BERT-style encoders run as causal decoders (what their *ForCausalLM is for)
    "add_cross_attention": False,
    "sliding_window": WINDOW,
    "window_size": WINDOW,
    "attention_window_size": WINDOW,
    # MoE: few small experts
    "num_experts": 4,
    "num_local_experts": 4,
    "n_routed_experts": 4,
    "moe_num_experts": 4,
    "num_experts_per_tok": 2,
    "moe_topk": 2,
    "moe_intermediate_size": 32,
    "expert_ffn_hidden_size": 32,
    "shared_expert_intermediate_size": 32,
    "n_shared_experts": 1,
    "n_group": 1,
    "topk_group": 1,
    # multi-head latent attention (DeepSeek V2/V3 style)
    "kv_lora_rank": 16,
    "q_lora_rank": 16,
    "qk_rope_head_dim": 8,
    "qk_nope_head_dim": 8,
    "v_head_dim": 16,
    "qk_head_dim": 16,
}
ALIASES: dict[str, tuple[str, ...]] = {
    "hidden_size": ("n_embd", "d_model", "dim", "embed_dim", "hidden_dim", "n_embed"),
    "num_hidden_layers": ("n_layer", "n_layers", "num_layers", "decoder_layers"),
    "num_attention_heads": ("n_head", "n_heads", "decoder_attention_heads"),
    "num_key_value_heads": ("num_kv_heads", "n_kv_heads", "multi_query_group_num"),
    "intermediate_size": ("n_inner", "ffn_dim", "decoder_ffn_dim", "ffn_hidden_size", "d_ff", "n_ctx_ffn"),
    "max_position_embeddings": ("n_positions", "max_seq_len", "n_ctx", "max_sequence_length"),
    "initializer_range": ("init_std", "initializer_factor"),
}
# config fields that list one entry per layer: cut to one layer of each kind the default config uses
PER_LAYER = ("layer_types", "mlp_layer_types", "layers_block_type", "attention_layers", "block_types")

# model_type -> config fields set on top of the generic ones
_MOE_TEXT = {"num_experts_per_tok": 2}
# initializer ranges that keep greedy outputs varied (the generic 0.2 makes these repeat one token)
_INIT = {
    **dict.fromkeys(("gemma3_text", "gemma3n_text", "gemma4_text", "gemma4_unified_text", "marian"), 0.02),
    **dict.fromkeys(("gemma2", "roformer"), 0.05),
    **dict.fromkeys(
        (
            "gemma",
            "minicpm3",
            "falcon_mamba",
            "mamba",
            "vaultgemma",
            "bart",
            "mvp",
            "trocr",
            "bert-generation",
            "starcoder2",
            "blenderbot-small",
            "plbart",
            "phi",
            "roc_bert",
            "camembert",
            "xlm-roberta",
            "gpt_bigcode",
            "gpt_neox",
            "openai-gpt",
        ),
        0.5,
    ),
    **dict.fromkeys(("biogpt", "xglm", "zaya", "bloom"), 1.0),
}
OVERRIDES: dict[str, dict[str, Any]] = {
    # multi-head latent attention: as many KV heads as query heads, rotary part = head_dim
    **{
        t: {"num_key_value_heads": 4, "head_dim": 8}
        for t in (
            "axk1",
            "axk2",
            "deepseek_v2",
            "deepseek_v3",
            "deepseek_v32",
            "glm4_moe_lite",
            "glm_moe_dsa",
            "longcat_flash",
            "minicpm3",
            "sarvam_mla",
            "youtu",
        )
    },
    # DeepSeek sparse attention: a small indexer
    **{
        t: {"num_key_value_heads": 4, "head_dim": 8, "index_n_heads": 2, "index_head_dim": 16}
        for t in ("axk2", "deepseek_v32", "glm_moe_dsa")
    },
    "ergo": {"first_dense_intermediate_size": 64, "shared_intermediate_size": 32},
    # sparse indexed attention every few layers, with keys and values shared across layers
    "kolibri1_1": {
        "index_layers": [1],
        "kv_source_layers": [0, 1],
        "mlp_only_layers": [0],
        "mlp_only_intermediate_size": 64,
        "shared_expert_intermediate_size": 32,
        "index_num_heads": 2,
        "index_topk": 4,
        "index_pool_size": 64,
        "index_compression": 2,
        "index_num_local_tokens": 2,
        "index_num_sink_tokens": 1,
    },
    "codegen": {"rotary_dim": 8},
    "gptj": {"rotary_dim": 8},
    "cwm": {"bos_token_id": 0, "eos_token_id": 1},
    "modernbert-decoder": {
        "pad_token_id": 0,
        "bos_token_id": 0,
        "eos_token_id": 1,
        "cls_token_id": 0,
        "sep_token_id": 1,
        "local_attention": 2 * WINDOW,  # its sliding window is local_attention // 2
    },
    "prophetnet": {
        "pad_token_id": 0,
        "num_decoder_layers": 2,
        "num_encoder_layers": 1,
        "num_decoder_attention_heads": 4,
        "num_encoder_attention_heads": 4,
        "decoder_ffn_dim": 64,
        "encoder_ffn_dim": 64,
        "is_decoder": True,
        "add_cross_attention": False,
    },
    "ernie4_5_moe": {"moe_k": 2, "moe_num_shared_experts": 1},
    **{
        t: {"pad_token_id": 1}
        for t in (  # RoBERTa-style: positions start after padding_idx (a required id)
            "camembert",
            "data2vec-text",
            "roberta",
            "roberta-prelayernorm",
            "xlm-roberta",
            "xlm-roberta-xl",
            "xmod",
        )
    },
    "lfm2": {"layer_types": ["conv", "full_attention"]},
    # hybrid sliding / global attention with relative-position and short-convolution branches (refused: conv state)
    **{
        t: {
            "swa_num_attention_heads": 4,
            "swa_num_key_value_heads": 2,
            "swa_head_dim": 16,
            "unpadded_vocab_size": VOCAB,
            "d_rel": 4,
            "rel_extent": 16,
            "sliding_window_size": WINDOW,
        }
        for t in ("inkling2_text", "inkling2_loop_text")
    },
    # a looped decoder: an input, a recurrent (run twice, one KV cache per loop) and an output layer
    "dory": {
        "num_hidden_layers": 3,
        "n_input_layers": 1,
        "n_output_layers": 1,
        "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
    },
    "lfm2_moe": {"layer_types": ["conv", "full_attention"], "num_dense_layers": 1},
    "zaya": {"num_experts_per_tok": 1, "router_hidden_size": 32},
    "dbrx": {
        "attn_config": {"kv_n_heads": 2, "rope_theta": 10000.0, "clip_qkv": 8.0},  # the attention reads rope_theta
        "ffn_config": {"ffn_hidden_size": 64, "moe_num_experts": 4, "moe_top_k": 2},
    },
    "mamba2": {"num_heads": 8, "head_dim": 16, "n_groups": 1, "state_size": 16, "chunk_size": 16},
    "jamba": {"attn_layer_period": 2, "attn_layer_offset": 1, "expert_layer_period": 2, "expert_layer_offset": 1},
    "bamba": {"attn_layer_indices": [1], "mamba_n_heads": 8, "mamba_d_state": 16, "mamba_chunk_size": 16},
    "granitemoehybrid": {
        "layer_types": ["mamba", "attention"],
        "mamba_n_heads": 8,
        "mamba_d_state": 16,
        "mamba_chunk_size": 16,
        "shared_intermediate_size": 32,
    },
    "zamba": {"layers_block_type": ["mamba", "hybrid", "hybrid"], "num_hidden_layers": 3},
    "cohere_compass_text": {
        "layer_types": ["sliding_attention", "full_attention"],
        "rope_parameters": {
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention": {"rope_type": "default", "rope_theta": 10000.0},
        },
    },
    "gemma3n_text": {
        "num_kv_shared_layers": 0,
        "hidden_size_per_layer_input": 16,
        "vocab_size_per_layer_input": VOCAB,
        "laurel_rank": 8,
        "activation_sparsity_pattern": [0.0, 0.0],
        "altup_num_inputs": 2,
    },
    "gemma4_text": {"hidden_size_per_layer_input": 16, "vocab_size_per_layer_input": VOCAB},
    "gemma4_unified_text": {"hidden_size_per_layer_input": 16, "vocab_size_per_layer_input": VOCAB},
    "qwen4_exp_text": {
        "indexer_n_heads": 2,
        "indexer_kv_heads": 1,
        "indexer_head_dim": 16,
        "indexer_budget": 64,
        "indexer_compress_ratio": 4,
        "hc_lowrank": 8,
        "ngram_vocab_size_base": VOCAB,
        "split_ngram_parts": 4,
        "linear_key_head_dim": 16,
        "linear_value_head_dim": 16,
        "linear_num_key_heads": 2,
        "linear_num_value_heads": 4,
    },
    "cpmant": {
        "dim_head": 16,
        "dim_ff": 64,
        "prompt_length": 4,
        "prompt_types": 2,
        "segment_types": 2,
        "position_bias_num_buckets": 32,
        "position_bias_max_distance": 128,
    },
    "roc_bert": {
        "pronunciation_embed_dim": 16,
        "shape_embed_dim": 16,
        "pronunciation_vocab_size": 32,
        "shape_vocab_size": 32,
    },
    "xlm": {"emb_dim": 64, "causal": True, "is_encoder": False, "n_langs": 1},
    "xlstm": {"embedding_dim": 64, "num_heads": 4, "num_blocks": 2, "chunk_size": 16, "qk_dim_factor": 1.0},
    "reformer": {
        "is_decoder": True,
        "attn_layers": ["local", "local"],
        "attention_head_size": 16,
        "axial_pos_shape": [16, 16],
        "axial_pos_embds_dim": [32, 32],
        "feed_forward_size": 64,
        "local_attn_chunk_length": 16,
        "max_position_embeddings": 256,
    },
    "gpt_neo": {"attention_types": [[["global", "local"], 1]]},
    "llama4_text": {"attention_chunk_size": WINDOW},
    # transformers applies Moshi's sliding_window only by evicting DynamicCache entries (prefill attends to all of
    # the prompt, decoding to the last window): generate() disagrees with the model's own uncached forward, and
    # no mask reproduces it. Real Moshi's window is 3000 tokens; the sweep checks the rest of the model.
    "moshi": {"sliding_window": 4096},  # chunked attention: chunks shorter than the sequence
}

# (model_type, variant) -> config fields of an extra case
VARIANTS: dict[tuple[str, str], dict[str, Any]] = {
    ("qwen2", "sliding"): {  # Qwen2 slides only with use_sliding_window, on layers >= max_window_layers
        "use_sliding_window": True,
        "max_window_layers": 1,
        "layer_types": ["full_attention", "sliding_attention"],
    },
    ("falcon", "alibi"): {"alibi": True},
}

# model_type -> why it is not a case
_MULTIMODAL = "multimodal model (composite config with a vision/audio tower)"
SKIPPED: dict[str, str] = {
    **{
        t: f"{_MULTIMODAL}; its text model is the case {t}_text"
        for t in (
            "gemma3",
            "gemma3n",
            "gemma4",
            "gemma4_unified",
            "qwen3_5",
            "qwen3_5_moe",
            "qwen4_exp",
            "dots3_note",
        )
    },
    "llama4": f"{_MULTIMODAL}; its text model is the case llama4_text",
    "mllama": f"{_MULTIMODAL}: cross-attention layers to image features",
    "fuyu": f"{_MULTIMODAL}: image patches fed into the decoder",
    "emu3": f"{_MULTIMODAL}: VQ image tokenizer",
    "got_ocr2": f"{_MULTIMODAL}: OCR image encoder",
    "git": f"{_MULTIMODAL}: image-to-text",
    "phi4_multimodal": f"{_MULTIMODAL}: vision and audio encoders",
    "moss_transcribe_diarize": f"{_MULTIMODAL}: speech encoder",
    "musicgen": "audio codebook decoder (several token streams per step), not a text LM",
    "musicgen_melody": "audio codebook decoder (several token streams per step), not a text LM",
    "blt": "byte latent transformer: entropy-model patching with local encoder/decoder, no tiny config",
    "dots3_note_text": "its causal LM class is the multimodal Dots3NoteForCausalLM, which ignores a text-only config",
    "cpmant": "CPM-Ant: prompt and segment embeddings index the vocabulary with offsets of its own tokenizer",
    "prophetnet": "ProphetNet decoder: n-gram prediction streams; transformers' own generate fails without an encoder",
    "xlm": "transformers' XLM runs only as an encoder (NotImplementedError as a decoder)",
    "gemma4_assistant": "draft head (MTP assistant) that runs on its target's KV cache, not a standalone LM",
    "gemma4_unified_assistant": "draft head (MTP assistant) that runs on its target's KV cache, not a standalone LM",
}

# case id -> "supported" (decodekit must equal transformers) or "refused" (load_model raises a DecodeKitError)
# Refused: what decodekit's KV cache + 4-D mask + position_ids interface cannot make exact.
STATEFUL = (  # recurrent, convolutional or linear-attention state outside the KV cache (rollback impossible)
    "bailing_hybrid",
    "bamba",
    "deepseek_v4",
    "falcon_h1",
    "falcon_mamba",
    "granitemoehybrid",
    "inkling2_loop_text",
    "inkling2_text",
    "inkling_text",
    "jamba",
    "kimi_linear",
    "lara_mini",
    "lfm2",
    "lfm2_moe",
    "lfm3",
    "mamba",
    "mamba2",
    "minimax",
    "nemotron_h",
    "olmo_hybrid",
    "qwen3_5_moe_text",
    "qwen3_5_text",
    "qwen3_next",
    "qwen4_exp_text",
    "recurrent_gemma",
    "rwkv",
    "xlstm",
    "zamba",
    "zamba2",
    "zaya",
)
# sparse attention whose indexer keeps its own key cache
INDEXED = ("axk2", "deepseek_v32", "glm_moe_dsa", "hy_v4", "kolibri1_1")
ALIBI = ("bloom", "falcon-alibi")  # ALiBi bias built from a 2-D padding mask (MPT's comes from key slots: exact)
OWN_POSITIONS = (  # decoders of encoder-decoder models: positions from the cache length, position_ids ignored
    "bart",
    "bigbird_pegasus",
    "blenderbot",
    "blenderbot-small",
    "marian",
    "mbart",
    "mvp",
    "pegasus",
    "plbart",
    "trocr",
)
# BERT-style encoders run as decoders (their LM head transforms before the output embedding): decodekit's own list.
# Taking it from the code loses nothing: a type dropped from it becomes "supported" here and must then be exact.
ENCODERS = tuple(t for t, why in REFUSED.items() if why == ENCODER_REASON)
OTHER_REFUSED = {
    "xlnet": "two-stream attention with its own memory (mems), no Cache",
    "reformer": "LSH / chunked local attention with its own cache",
    "openai-gpt": "no KV cache at all (transformers recomputes the whole sequence); builds its mask from a 2-D one",
}
EXPECTED: dict[str, str] = dict.fromkeys(
    (*STATEFUL, *INDEXED, *ALIBI, *OWN_POSITIONS, *ENCODERS, *OTHER_REFUSED), "refused"
)


def case_id(model_type: str, variant: str | None = None) -> str:
    return model_type if variant is None else f"{model_type}-{variant}"


def _fields(config_class: type) -> set[str]:
    return {f.name for f in dataclasses.fields(config_class)} if dataclasses.is_dataclass(config_class) else set()


def _defaults(config_class: type) -> dict[str, Any]:
    out = {}
    for f in dataclasses.fields(config_class):
        if f.default is not dataclasses.MISSING:
            out[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            out[f.name] = f.default_factory()
    return out


def _one_of_each(layers: list[Any]) -> list[Any]:
    kinds = list(dict.fromkeys(str(k) for k in layers))
    picked = [next(k for k in layers if str(k) == kind) for kind in kinds]
    return picked if len(picked) > 1 else picked * 2


def tiny_config_kwargs(model_type: str, variant: str | None = None) -> dict[str, Any]:
    """The config fields of a case (generic small settings, per-layer lists cut, overrides)."""
    config_class = CONFIG_MAPPING[model_type]
    fields = _fields(config_class)
    kwargs: dict[str, Any] = {}
    for name, value in SMALL.items():
        for field_name in (name, *ALIASES.get(name, ())):
            if field_name in fields:
                kwargs[field_name] = value
    overrides = dict(OVERRIDES.get(model_type, {}))
    if model_type in _INIT:
        overrides |= {k: _INIT[model_type] for k in ("initializer_range", *ALIASES["initializer_range"]) if k in fields}
    if variant is not None:
        overrides |= VARIANTS[(model_type, variant)]
    try:
        defaults = config_class().to_dict()
    except Exception:  # a config that validates its defaults against fields we override
        defaults = _defaults(config_class)
    layers = None
    for name in PER_LAYER:
        if name in overrides or not isinstance(defaults.get(name), list) or not defaults[name]:
            continue
        kwargs[name] = _one_of_each(defaults[name])
        layers = max(layers or 0, len(kwargs[name]))
    if layers is not None:
        for name in PER_LAYER:
            if name in kwargs and len(kwargs[name]) < layers:
                kwargs[name] = (kwargs[name] * layers)[:layers]
        for field_name in ("num_hidden_layers", *ALIASES["num_hidden_layers"]):
            if field_name in kwargs:
                kwargs[field_name] = layers
    return kwargs | overrides


def tiny_config(model_type: str, variant: str | None = None):
    return CONFIG_MAPPING[model_type](**tiny_config_kwargs(model_type, variant))


@functools.cache
def tiny_model(model_type: str, variant: str | None = None) -> torch.nn.Module:
    """The case's model (:func:`build_model`), built once: tests must not modify it."""
    return build_model(model_type, variant)


def build_model(model_type: str, variant: str | None = None) -> torch.nn.Module:
    """A fresh model of the case: float32, seeded (seed 0), ``sdpa`` attention where the class supports it (else
    eager), eval mode, a default generation config with no EOS/BOS/PAD ids."""
    config = tiny_config(model_type, variant)
    model_class = _model_class(model_type)
    attn = "sdpa" if getattr(model_class, "_supports_sdpa", False) else "eager"
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = AutoModelForCausalLM.from_config(config, attn_implementation=attn, dtype=torch.float32)
    n = sum(p.numel() for p in model.parameters())
    if n > MAX_PARAMS:
        raise AssertionError(f"{case_id(model_type, variant)}: {n} parameters, not tiny; add an override")
    if model_type == "xmod":
        model.set_default_language("en_XX")
    model.generation_config = GenerationConfig(pad_token_id=0)  # plain defaults: no EOS, no penalties
    return model.eval()


def _model_class(model_type: str) -> type:
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    return MODEL_FOR_CAUSAL_LM_MAPPING[CONFIG_MAPPING[model_type]]


CASES: list[tuple[str, str | None]] = [
    *((t, None) for t in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES if t not in SKIPPED),
    *sorted(VARIANTS),
]
