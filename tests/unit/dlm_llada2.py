"""A tiny random LLaDA 2 checkpoint in its released on-disk layout, and our own ports of its reference forward and
``generate`` (``modeling_llada2_moe.py`` as published with LLaDA2.0-mini-preview; zhangshuibai/dInfer @ 290b36d,
``models/LLaDA2.0-mini-preview``): written here, not copied, and deliberately shaped unlike transformers' GLM-4 MoE
modules (one token at a time through the router and its experts)."""

from __future__ import annotations

import math
from pathlib import Path

import torch
import torch.nn.functional as F

from tests.unit.dlm_families import _rms, _rotate_half, save_shards, start_checkpoint
from tests.word_tokenizer import save_word_tokenizer

# LLaDA2.0-mini's config.json keys as released, sizes shrunk: 2 layers (the first dense, the second 8 experts in 4
# groups, 2 picked from the best 2 groups, one shared expert), hidden 32, 4 heads of 8, GQA 2, rotary on half of
# each head; no mask id (the tokenizer's <|mask|>), no block size (generate's default 32)
LLADA2_CONFIG = {
    "architectures": ["LLaDA2MoeModelLM"],
    "attention_dropout": 0.0,
    "auto_map": {
        "AutoConfig": "configuration_llada2_moe.LLaDA2MoeConfig",
        "AutoModel": "modeling_llada2_moe.LLaDA2MoeModel",
        "AutoModelForCausalLM": "modeling_llada2_moe.LLaDA2MoeModelLM",
    },  # fmt: skip
    "dtype": "bfloat16",
    "embedding_dropout": 0.0,
    "first_k_dense_replace": 1,
    "head_dim": 8,
    "hidden_act": "silu",
    "hidden_size": 32,
    "initializer_range": 0.02,
    "intermediate_size": 48,
    "max_position_embeddings": 256,
    "max_window_layers": 2,
    "model_type": "llada2_moe",
    "moe_intermediate_size": 16,
    "moe_router_enable_expert_bias": True,
    "n_group": 4,
    "norm_head": False,
    "norm_topk_prob": True,
    "num_attention_heads": 4,
    "num_experts": 8,
    "num_experts_per_tok": 2,
    "num_hidden_layers": 2,
    "num_key_value_heads": 2,
    "num_shared_experts": 1,
    "output_dropout": 0.0,
    "output_router_logits": False,
    "pad_token_id": 126,
    "partial_rotary_factor": 0.5,
    "rms_norm_eps": 1e-06,
    "rope_scaling": None,
    "rope_theta": 600000,
    "routed_scaling_factor": 2.5,
    "router_dtype": "fp32",
    "score_function": "sigmoid",
    "tie_word_embeddings": False,
    "topk_group": 2,
    "transformers_version": "4.52.3",
    "use_bias": False,
    "use_cache": False,
    "use_qk_norm": True,
    "use_qkv_bias": False,
    "use_sliding_window": False,
    "vocab_size": 128,
}
LLADA2_MASK = 127  # where the word tokenizer puts <|mask|>


def llada2_tensors(config: dict, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random float32 weights under LLaDA 2's names (``LLaDA2MoeModelLM``): norm weights near 1, an output layer
    large enough for peaked logits, router weights and expert biases large enough that the bias changes which experts
    a token gets."""
    gen = torch.Generator().manual_seed(seed)
    d, hd, heads, kv = (
        config["hidden_size"],
        config["head_dim"],
        config["num_attention_heads"],
        config["num_key_value_heads"],
    )

    def rand(*shape: int, scale: float = 1.0) -> torch.Tensor:
        return torch.randn(*shape, generator=gen) * scale / math.sqrt(shape[-1])

    def norm(n: int) -> torch.Tensor:
        return 1 + 0.1 * torch.randn(n, generator=gen)

    def mlp(prefix: str, width: int) -> dict[str, torch.Tensor]:
        return {f"{prefix}.gate_proj.weight": rand(width, d), f"{prefix}.up_proj.weight": rand(width, d),
                f"{prefix}.down_proj.weight": rand(d, width)}  # fmt: skip

    t = {
        "model.word_embeddings.weight": torch.randn(config["vocab_size"], d, generator=gen),
        "model.norm.weight": norm(d),
    }
    t["lm_head.weight"] = rand(config["vocab_size"], d, scale=8.0)
    t["lm_head.weight"][LLADA2_MASK] = 0  # a trained DLM never proposes its mask token; the reference would
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}"
        t[f"{p}.input_layernorm.weight"] = norm(d)
        t[f"{p}.attention.query_key_value.weight"] = rand((heads + 2 * kv) * hd, d, scale=2.0)
        t[f"{p}.attention.query_layernorm.weight"] = norm(hd)
        t[f"{p}.attention.key_layernorm.weight"] = norm(hd)
        t[f"{p}.attention.dense.weight"] = rand(d, heads * hd)
        t[f"{p}.post_attention_layernorm.weight"] = norm(d)
        if i < config["first_k_dense_replace"]:
            t |= mlp(f"{p}.mlp", config["intermediate_size"])
            continue
        t[f"{p}.mlp.gate.weight"] = rand(config["num_experts"], d, scale=3.0)
        t[f"{p}.mlp.gate.expert_bias"] = 0.3 * torch.randn(config["num_experts"], generator=gen)
        for e in range(config["num_experts"]):
            t |= mlp(f"{p}.mlp.experts.{e}", config["moe_intermediate_size"])
        t |= mlp(f"{p}.mlp.shared_experts", config["moe_intermediate_size"] * config["num_shared_experts"])
    return t


def write_llada2(path: Path, config: dict | None = None, seed: int = 0) -> dict[str, torch.Tensor]:
    """A LLaDA 2 checkpoint directory: ``config.json``, two safetensors shards and their index (as released), a
    word tokenizer whose last token is ``<|mask|>``, poisoned ``modeling_llada2_moe.py`` /
    ``configuration_llada2_moe.py``. Returns the tensors written."""
    config = config or LLADA2_CONFIG
    start_checkpoint(path, config, ("modeling_llada2_moe.py", "configuration_llada2_moe.py"))
    tensors = llada2_tensors(config, seed)
    save_shards(path, tensors)
    save_word_tokenizer(path, [f"w{i}" for i in range(config["vocab_size"] - 1)] + ["<|mask|>"], mask_token="<|mask|>")
    return tensors


def _moe(t: dict, p: str, config: dict, h: torch.Tensor) -> torch.Tensor:
    """``LLaDA2MoeSparseMoeBlock`` in eval mode, token by token: ``LLaDA2MoeGate`` (sigmoid scores; the scores plus
    ``expert_bias`` choose ``topk_group`` groups by their two best, then ``num_experts_per_tok`` experts among them,
    the others at -inf; the chosen unbiased scores normalised when more than one, times ``routed_scaling_factor``),
    the chosen experts' MLPs so weighted, plus the shared experts."""
    groups, top_k = config["n_group"], config["num_experts_per_tok"]
    out = torch.zeros_like(h)
    for n, x in enumerate(h):
        scores = torch.sigmoid(F.linear(x.float(), t[f"{p}.gate.weight"].float()))
        biased = scores + t[f"{p}.gate.expert_bias"]
        by_group = biased.view(groups, -1)
        best_groups = by_group.topk(2, dim=-1).values.sum(-1).topk(config["topk_group"]).indices
        allowed = torch.zeros(groups, dtype=torch.bool)
        allowed[best_groups] = True
        chosen = biased.masked_fill(~allowed.repeat_interleave(by_group.shape[1]), float("-inf")).topk(top_k).indices
        weights = scores[chosen]
        if top_k > 1:
            weights = weights / (weights.sum() + 1e-20)
        for e, w in zip(chosen.tolist(), weights * config["routed_scaling_factor"]):
            out[n] += w * _mlp(t, f"{p}.experts.{e}", x)
    return out + _mlp(t, f"{p}.shared_experts", h)


def _mlp(t: dict, p: str, x: torch.Tensor) -> torch.Tensor:
    return F.linear(F.silu(F.linear(x, t[f"{p}.gate_proj.weight"])) * F.linear(x, t[f"{p}.up_proj.weight"]),
                    t[f"{p}.down_proj.weight"])  # fmt: skip


@torch.no_grad()
def llada2_forward(t: dict, config: dict, ids: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """``LLaDA2MoeModelLM.forward`` (eager attention, no cache) on ``ids [1, L]`` under ``mask [L, L]`` (True: may
    attend; None: every position sees every other) -> logits ``[1, L, V]``: RMS norms, the fused q / k / v split per
    head, per-head q / k norms, rotate-half rotary embeddings on the first ``partial_rotary_factor`` of each head,
    grouped K/V heads repeated, attention scaled by ``1 / sqrt(head_dim)``, the dense MLP or the MoE block."""
    heads, kv, hd = config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"]
    eps, length = config["rms_norm_eps"], ids.shape[1]
    rot = int(hd * config["partial_rotary_factor"])
    inv = 1.0 / config["rope_theta"] ** (torch.arange(0, rot, 2, dtype=torch.float) / rot)
    angles = torch.outer(torch.arange(length, dtype=torch.float), inv).repeat(1, 2)
    cos, sin = angles.cos(), angles.sin()
    x = F.embedding(ids[0], t["model.word_embeddings.weight"])
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}"
        h = _rms(x, t[f"{p}.input_layernorm.weight"], eps)
        qkv = F.linear(h, t[f"{p}.attention.query_key_value.weight"]).view(length, heads + 2 * kv, hd)
        q, k, v = qkv[:, :heads], qkv[:, heads : heads + kv], qkv[:, heads + kv :]
        q = _rms(q, t[f"{p}.attention.query_layernorm.weight"], eps)
        k = _rms(k, t[f"{p}.attention.key_layernorm.weight"], eps)
        q, k = (torch.cat([u[..., :rot] * cos[:, None] + _rotate_half(u[..., :rot]) * sin[:, None], u[..., rot:]], -1)
                for u in (q, k))  # fmt: skip
        k, v = k.repeat_interleave(heads // kv, 1), v.repeat_interleave(heads // kv, 1)
        scores = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(hd)
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        att = torch.einsum("hqk,khd->qhd", scores.softmax(-1), v).reshape(length, heads * hd)
        x = x + F.linear(att, t[f"{p}.attention.dense.weight"])
        h = _rms(x, t[f"{p}.post_attention_layernorm.weight"], eps)
        x = x + (_mlp(t, f"{p}.mlp", h) if i < config["first_k_dense_replace"] else _moe(t, f"{p}.mlp", config, h))
    return (_rms(x, t["model.norm.weight"], eps) @ t["lm_head.weight"].T)[None].float()


def llada2_generate(forward, prompt: list[int], gen_length: int, block: int, steps: int, threshold: float) -> list[int]:
    """``LLaDA2MoeModelLM.generate`` at temperature 0 (no top-k / top-p: the argmax and its softmax probability), one
    row, no EOS stop: blocks of ``block`` on the absolute grid from the one holding the prompt's end, each block
    re-run over the canvas so far under the block-causal mask, ``steps`` steps a block committing every masked slot
    whose probability exceeds ``threshold``, or the schedule's count of the most confident when fewer do. Returns the
    first ``gen_length`` tokens after the prompt."""
    length = len(prompt)
    blocks = -(-(length + gen_length) // block)
    x = torch.full((blocks * block,), LLADA2_MASK)
    x[:length] = torch.tensor(prompt)
    steps = min(steps, gen_length)
    counts = [block // steps + (i < block % steps) for i in range(steps)]
    grid = torch.arange(blocks * block) // block
    for b in range(length // block, blocks):
        end = (b + 1) * block
        for step in range(steps):
            masked = x[end - block : end] == LLADA2_MASK
            if not masked.any():
                break
            logits = forward(x[None, :end], grid[:end, None] >= grid[None, :end])[0, -block:]
            probs = logits.softmax(-1)
            x0 = logits.argmax(-1)
            confidence = torch.where(masked, probs.gather(-1, x0[:, None])[:, 0], -torch.inf)
            sure = confidence > threshold
            if int(sure.sum()) >= counts[step]:
                transfer = sure
            else:
                transfer = torch.zeros(block, dtype=torch.bool)
                transfer[torch.topk(confidence, min(counts[step], int(masked.sum()))).indices] = True
            x[end - block : end] = torch.where(transfer, x0, x[end - block : end])
    return x[length : length + gen_length].tolist()
