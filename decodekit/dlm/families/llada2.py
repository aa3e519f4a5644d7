"""LLaDA 2 (``inclusionAI/LLaDA2.0-mini``, ``-flash`` and their previews: ``LLaDA2MoeModelLM``, ``model_type:
llada2_moe``) as transformers' GLM-4 MoE decoder, block-causal.

LLaDA 2 is a BailingMoE-V2 (Ling 2.0) mixture of experts continued-pretrained as a block diffusion LM. Per layer:
``x + dense(attention(query_key_value of input_layernorm(x)))`` with the fused q / k / v projection split as
``[heads, kv_heads, kv_heads] x head_dim`` rows, per-head RMS norms on q and k (``query_layernorm`` /
``key_layernorm``), rotary embeddings on the first ``partial_rotary_factor`` of each head (rotate-half), then
``+ mlp(post_attention_layernorm(x))`` where the first ``first_k_dense_replace`` layers have a SiLU-gated MLP and the
others a mixture of experts: a sigmoid router (``gate.weight``) whose scores plus ``gate.expert_bias`` pick
``topk_group`` of ``n_group`` groups (each group scored by its two best experts) and then ``num_experts_per_tok``
experts; their unbiased scores, normalised to sum to 1 (when more than one), times ``routed_scaling_factor``, weight
the experts' SiLU-gated MLPs (``experts.{e}.*``), plus ``num_shared_experts`` always-on experts (``shared_experts``,
one MLP that wide). That is transformers' ``Glm4MoeForCausalLM`` one for one: q / k / v are sliced out of the fused
projection, the experts stacked into its ``gate_up_proj`` / ``down_proj``, ``expert_bias`` read as
``e_score_correction_bias``; attention is made block-causal by the masks :class:`~decodekit.dlm.DLMModel` passes.

Its ``generate`` attends block-causally on the absolute grid (block ``k`` holds positions ``[kL, (k + 1)L)``; the
prompt's tail shares the first generated block), logits not shifted, blocks of 32 (its default ``block_length``:
the configs name none; a ``block_length`` / ``block_size`` key is read if present), mask token 156895 (``<|mask|>``:
``config.json``'s ``mask_token_id``, else the tokenizer's mask token, else that id). Each block's steps commit every
masked slot whose argmax probability exceeds ``threshold`` (0.95), or the scheduled number of the most confident
ones when fewer pass: ``dk.build("dlm_rule", "sdar", strategy="low_confidence_dynamic", threshold=0.95)`` at
temperature 0.

Faithfulness: checked against the modeling code published with LLaDA2.0-mini-preview (``modeling_llada2_moe.py``,
as zhangshuibai/dInfer keeps it at ``models/LLaDA2.0-mini-preview`` @ 290b36d): ``tests/unit/test_dlm_families.py``
compares logits with a port of its forward and tokens with a port of its ``generate`` at temperature 0 on tiny random
checkpoints written in this layout. What its code or these configs do not use is refused by name: biases on the
output projection (``use_bias``), a normalised output head (``norm_head``), sliding windows, rope scaling, another
router score than the sigmoid, ``norm_topk_prob=false`` (that code normalises regardless).
"""

from __future__ import annotations

from typing import Any

import torch

from decodekit.dlm.families import Derived, Family, Source, mask_from
from decodekit.errors import UnsupportedModelError

__all__ = ["LLADA2"]

MASK_TOKEN_ID = 156895  # <|mask|>, modeling_llada2_moe.generate's default mask_id
BLOCK_LENGTH = 32  # its generate's default block_length
# setting -> the value decodekit implements (what the released configs set; the config class's default if absent)
REQUIRED = {
    "use_bias": (False, True),
    "norm_head": (False, False),
    "use_sliding_window": (False, False),
    "rope_scaling": (None, None),
    "score_function": ("sigmoid", "sigmoid"),
    "norm_topk_prob": (True, True),
    "hidden_act": ("silu", "silu"),
}
MLP = ("gate_proj", "up_proj", "down_proj")


def _check(config: dict[str, Any]) -> None:
    for key, (want, default) in REQUIRED.items():
        have = config.get(key, default)
        if have != want:
            raise UnsupportedModelError(
                f"LLaDA 2 checkpoint with {key}={have!r}: decodekit reads LLaDA 2's released layout ({key}={want!r}); "
                "this variant is not implemented"
            )
    for key in ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size", "num_experts"):
        if config.get(key) is None:
            raise UnsupportedModelError(f"LLaDA 2 config.json has no {key!r}: is this a LLaDA 2 checkpoint?")
    _check_routing(config)


def _check_routing(config: dict[str, Any]) -> None:
    """The group-limited router's settings fit together (``num_experts`` split into ``n_group`` groups of at least
    two, each scored by its best two; ``topk_group`` of the groups kept; ``num_experts_per_tok`` experts chosen), so
    a config that does not is refused here rather than inside the router at the first forward."""
    experts, groups = int(config["num_experts"]), int(config.get("n_group", 1))
    kept, top_k = int(config.get("topk_group", 1)), int(config.get("num_experts_per_tok", 2))
    per_group = experts // groups if groups >= 1 else 0
    problem = None
    if groups < 1 or experts % groups or per_group < 2:
        problem = f"num_experts ({experts}) must split into n_group ({groups}) groups of two or more"
    elif not 1 <= kept <= groups:
        problem = f"topk_group ({kept}) must be in 1 .. n_group ({groups})"
    elif not 1 <= top_k <= experts:
        problem = f"num_experts_per_tok ({top_k}) must be in 1 .. num_experts ({experts})"
    if problem is not None:
        given = {k: config.get(k, "(absent)") for k in ("num_experts", "n_group", "topk_group", "num_experts_per_tok")}
        raise UnsupportedModelError(f"LLaDA 2 config.json's router settings do not fit together: {problem} {given}")


def convert(config: dict[str, Any]) -> tuple[Any, dict[str, Source]]:
    """LLaDA 2's ``config.json`` -> a ``Glm4MoeConfig`` and ``{GLM-4 MoE parameter: LLaDA 2 tensor or Derived}``."""
    from transformers import Glm4MoeConfig

    _check(config)
    heads = int(config["num_attention_heads"])
    kv = int(config.get("num_key_value_heads") or heads)
    head_dim = int(config.get("head_dim") or config["hidden_size"] // heads)
    experts, top_k = int(config["num_experts"]), int(config.get("num_experts_per_tok", 2))
    shared = int(config.get("num_shared_experts") or 0)
    moe_width = int(config.get("moe_intermediate_size") or config["intermediate_size"])
    hf_config = Glm4MoeConfig(
        vocab_size=int(config["vocab_size"]),
        hidden_size=int(config["hidden_size"]),
        intermediate_size=int(config.get("intermediate_size") or moe_width),
        num_hidden_layers=int(config["num_hidden_layers"]),
        num_attention_heads=heads,
        num_key_value_heads=kv,
        head_dim=head_dim,
        hidden_act="silu",
        max_position_embeddings=int(config.get("max_position_embeddings", 16384)),
        rms_norm_eps=float(config.get("rms_norm_eps", 1e-5)),
        tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
        rope_parameters={
            "rope_type": "default",
            "rope_theta": float(config.get("rope_theta", 10000.0)),
            "partial_rotary_factor": float(config.get("partial_rotary_factor", 0.5)),
        },
        attention_bias=bool(config.get("use_qkv_bias", False)),
        moe_intermediate_size=moe_width,
        num_experts_per_tok=top_k,
        n_shared_experts=shared,
        n_routed_experts=experts,
        routed_scaling_factor=float(config.get("routed_scaling_factor", 2.5)),
        n_group=int(config.get("n_group", 1)),
        topk_group=int(config.get("topk_group", 1)),
        first_k_dense_replace=int(config.get("first_k_dense_replace", 0)),
        norm_topk_prob=top_k > 1,  # its gate normalises the chosen scores only when it picks more than one
        use_qk_norm=bool(config.get("use_qk_norm", True)),
        pad_token_id=config.get("pad_token_id"),
        eos_token_id=config.get("eos_token_id"),
        bos_token_id=None,
    )
    sources: dict[str, Source] = {"model.embed_tokens.weight": "model.word_embeddings.weight"}
    sources["model.norm.weight"] = "model.norm.weight"
    if not hf_config.tie_word_embeddings:
        sources["lm_head.weight"] = "lm_head.weight"
    expert_bias = bool(config.get("moe_router_enable_expert_bias", True))
    for i in range(hf_config.num_hidden_layers):
        sources |= _layer(i, hf_config, expert_bias)
    return hf_config, sources


def _layer(i: int, hf_config: Any, expert_bias: bool) -> dict[str, Source]:
    """Decoder layer ``i``'s ``{GLM-4 MoE parameter: source}`` (both layouts number layers alike); ``expert_bias``:
    the routers store ``gate.expert_bias`` (else a zero correction)."""
    theirs = ours = f"model.layers.{i}"
    head_dim, experts = hf_config.head_dim, hf_config.n_routed_experts
    heads, kv = hf_config.num_attention_heads, hf_config.num_key_value_heads
    out: dict[str, Source] = {
        f"{ours}.input_layernorm.weight": f"{theirs}.input_layernorm.weight",
        f"{ours}.post_attention_layernorm.weight": f"{theirs}.post_attention_layernorm.weight",
        f"{ours}.self_attn.o_proj.weight": f"{theirs}.attention.dense.weight",
    }
    sizes = [heads * head_dim, kv * head_dim, kv * head_dim]
    for kind in ("weight", "bias") if hf_config.attention_bias else ("weight",):
        fused = f"{theirs}.attention.query_key_value.{kind}"
        for part, name in enumerate("qkv"):
            out[f"{ours}.self_attn.{name}_proj.{kind}"] = Derived(
                (fused,), lambda t, part=part: t.split(sizes)[part].contiguous()
            )
    if hf_config.use_qk_norm:
        out[f"{ours}.self_attn.q_norm.weight"] = f"{theirs}.attention.query_layernorm.weight"
        out[f"{ours}.self_attn.k_norm.weight"] = f"{theirs}.attention.key_layernorm.weight"
    if i < hf_config.first_k_dense_replace:
        return out | {f"{ours}.mlp.{p}.weight": f"{theirs}.mlp.{p}.weight" for p in MLP}
    out[f"{ours}.mlp.gate.weight"] = Derived((f"{theirs}.mlp.gate.weight",), lambda w: w.float())  # float32 router
    out[f"{ours}.mlp.gate.e_score_correction_bias"] = (
        Derived((f"{theirs}.mlp.gate.expert_bias",), lambda b: b.float())
        if expert_bias
        else Derived((), lambda: torch.zeros(experts))
    )
    expert = [f"{theirs}.mlp.experts.{e}" for e in range(experts)]
    gate_up = tuple(f"{x}.{p}.weight" for x in expert for p in ("gate_proj", "up_proj"))
    out[f"{ours}.mlp.experts.gate_up_proj"] = Derived(gate_up, lambda *w: torch.stack(
        [torch.cat(w[j : j + 2]) for j in range(0, len(w), 2)]))  # fmt: skip
    out[f"{ours}.mlp.experts.down_proj"] = Derived(
        tuple(f"{x}.down_proj.weight" for x in expert), lambda *w: torch.stack(w)
    )
    for p in MLP:
        width = (hf_config.hidden_size, 0) if p == "down_proj" else (0, hf_config.hidden_size)
        out[f"{ours}.mlp.shared_experts.{p}.weight"] = (
            f"{theirs}.mlp.shared_experts.{p}.weight"
            if hf_config.n_shared_experts
            else Derived((), lambda w=width: torch.zeros(w))
        )
    return out


LLADA2 = Family(
    name="LLaDA 2",
    model_types=("llada2_moe",),
    architectures=("LLaDA2MoeModelLM",),
    convert=convert,
    mask_token_id=mask_from(MASK_TOKEN_ID),
    shift_logits=False,
    block_length=lambda config: int(config.get("block_length") or config.get("block_size") or BLOCK_LENGTH),
    block_grid="absolute",
)
