"""A tiny EAGLE-1/2 head in its authors' release layout, and our port of their draft head's forward
(SafeAILab/EAGLE ``eagle/model/cnets1.py``, ``Model.forward`` with one ``LlamaDecoderLayer`` of index 0; written
here, not copied): ``fc([embed ; feature])``, the layer without an input norm (attention with rotate-half rotary
embeddings at positions ``0 ..``, grouped K/V heads repeated, a causal mask; then the post-attention norm and the
SiLU-gated MLP), no final norm; the target's output head reads the result."""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
import torch.nn.functional as F

from tests.unit.dlm_families import _rms, _rotate_half

LAYER = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
         "mlp.up_proj", "mlp.down_proj")  # fmt: skip


def release_tensors(config: dict, seed: int) -> dict[str, torch.Tensor]:
    """Random weights under the release's names, large enough that every part moves the drafts (a chain of
    distinct tokens, which an input or a final norm the release does not have would change)."""
    gen = torch.Generator().manual_seed(seed)
    h, heads, kv = config["hidden_size"], config["num_attention_heads"], config["num_key_value_heads"]
    hd, mlp = h // heads, config["intermediate_size"]
    shapes = {"self_attn.q_proj": (h, h), "self_attn.k_proj": (kv * hd, h), "self_attn.v_proj": (kv * hd, h),
              "self_attn.o_proj": (h, h), "mlp.gate_proj": (mlp, h), "mlp.up_proj": (mlp, h),
              "mlp.down_proj": (h, mlp)}  # fmt: skip
    t = {
        "fc.weight": 3 * torch.randn(h, 2 * h, generator=gen) / math.sqrt(2 * h),
        "fc.bias": torch.randn(h, generator=gen),
        "layers.0.post_attention_layernorm.weight": 1 + 0.3 * torch.randn(h, generator=gen),
    }
    for name in LAYER:
        rows, cols = shapes[name]
        t[f"layers.0.{name}.weight"] = 2 * torch.randn(rows, cols, generator=gen) / math.sqrt(cols)
    return t


def write_release(path: Path, target_config, seed: int = 0, fmt: str = "bin", **edits) -> dict[str, torch.Tensor]:
    """An EAGLE-1 release directory for a target with ``target_config``: the head's ``config.json`` (Llama keys,
    one layer, ``bias``) and ``pytorch_model.bin`` (``fmt="bin"``) or ``model.safetensors``, plus the target's
    embedding as ``embed_tokens.weight`` as some releases carry it. ``edits`` change the config."""
    config = {
        "architectures": ["LlamaForCausalLM"], "bias": True, "hidden_act": "silu",
        "hidden_size": target_config.hidden_size, "intermediate_size": target_config.intermediate_size,
        "max_position_embeddings": target_config.max_position_embeddings, "model_type": "llama",
        "num_attention_heads": target_config.num_attention_heads, "num_hidden_layers": 1,
        "num_key_value_heads": target_config.num_key_value_heads, "pretraining_tp": 1,
        "rms_norm_eps": target_config.rms_norm_eps, "rope_scaling": None,
        "rope_theta": target_config.rope_parameters["rope_theta"], "tie_word_embeddings": False,
        "torch_dtype": "float16", "vocab_size": target_config.vocab_size, **edits,
    }  # fmt: skip
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config))
    tensors = release_tensors(config, seed)
    stored = {**tensors, "embed_tokens.weight": torch.zeros(config["vocab_size"], config["hidden_size"])}
    if fmt == "bin":
        torch.save(stored, path / "pytorch_model.bin")
    else:
        from safetensors.torch import save_file

        save_file(stored, str(path / "model.safetensors"))
    return tensors


def _attention(config, x: torch.Tensor, w: dict, h: int) -> torch.Tensor:
    """The head layer's causal self-attention on ``x [1, N, *]`` (q / k / v read ``x``; rotate-half rotary at
    positions ``0 ..``; grouped K/V heads repeated) -> the output projection's ``[1, N, H]``."""
    heads, kv = config.num_attention_heads, config.num_key_value_heads
    hd, n = h // heads, x.shape[1]
    q = F.linear(x, w["self_attn.q_proj"]).view(1, n, heads, hd).transpose(1, 2)
    k = F.linear(x, w["self_attn.k_proj"]).view(1, n, kv, hd).transpose(1, 2)
    v = F.linear(x, w["self_attn.v_proj"]).view(1, n, kv, hd).transpose(1, 2)
    inv = 1.0 / config.rope_parameters["rope_theta"] ** (torch.arange(0, hd, 2).float() / hd)
    angles = torch.outer(torch.arange(n).float(), inv)
    cos, sin = torch.cat([angles, angles], -1).cos(), torch.cat([angles, angles], -1).sin()
    q, k = q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin
    k, v = k.repeat_interleave(heads // kv, 1), v.repeat_interleave(heads // kv, 1)
    att = torch.softmax((q @ k.transpose(2, 3)) / math.sqrt(hd) + torch.full((n, n), -torch.inf).triu(1), -1) @ v
    return F.linear(att.transpose(1, 2).reshape(1, n, h), w["self_attn.o_proj"])


def _mlp(x: torch.Tensor, w: dict) -> torch.Tensor:
    return F.linear(F.silu(F.linear(x, w["mlp.gate_proj"])) * F.linear(x, w["mlp.up_proj"]), w["mlp.down_proj"])


@torch.no_grad()
def head_forward(t: dict, config, embeds: torch.Tensor, feats: torch.Tensor) -> torch.Tensor:
    """``cnets1.Model.forward`` without a cache: ``embeds`` / ``feats [1, N, H]`` (token ``x_{i+1}``'s embedding
    beside feature ``f_i``) -> ``[1, N, H]``."""
    h = config.hidden_size
    x = F.linear(torch.cat([embeds, feats], -1), t["fc.weight"], t["fc.bias"])
    w = {name: t[f"layers.0.{name}.weight"] for name in LAYER}
    x = x + _attention(config, x, w, h)
    return x + _mlp(_rms(x, t["layers.0.post_attention_layernorm.weight"], config.rms_norm_eps), w)


@torch.no_grad()
def first_draft(t: dict, hf_model, prompt: list[int], steps: int) -> list[int]:
    """EAGLE's greedy chain after ``prompt``: the target's features of the prompt and its next token (the pending
    one), the head run over ``(x_{i+1}, f_i)``, then ``steps`` times: the argmax of the target's output head on the
    head's last output, fed back with that output as its feature (recomputed, not cached: the same values)."""
    out = hf_model.model(torch.tensor([prompt]))
    feats = out.last_hidden_state
    pending = int(hf_model.lm_head(feats[0, -1]).argmax())
    tokens, drafted = prompt[1:] + [pending], []
    embed = hf_model.model.embed_tokens
    for _ in range(steps):
        g = head_forward(t, hf_model.config, embed(torch.tensor([tokens])), feats)[0, -1]
        drafted.append(int(hf_model.lm_head(g).argmax()))
        tokens, feats = tokens + [drafted[-1]], torch.cat([feats, g[None, None]], 1)
    return drafted


# EAGLE-3 (``eagle/model/cnets.py``: ``Model`` with ``LlamaDecoderLayeremb``): the same layer tensors (``LAYER``)


def write_release3(path: Path, target_config, draft_ids: list[int], seed: int = 0, **edits) -> dict[str, torch.Tensor]:
    """An EAGLE-3 release directory for a target with ``target_config``: ``config.json`` (Llama keys, one layer,
    ``draft_vocab_size``) and ``pytorch_model.bin`` with ``fc`` (``[H, 3H]``), ``midlayer.*`` (q / k / v reading
    ``2H``), ``norm``, ``lm_head`` over the draft vocabulary ``draft_ids`` (ascending target ids) and ``d2t`` / ``t2d``
    as the authors store them. Random weights large enough that every part moves the drafts."""
    h, heads, kv = target_config.hidden_size, target_config.num_attention_heads, target_config.num_key_value_heads
    hd, mlp, vd = h // heads, target_config.intermediate_size, len(draft_ids)
    config = {
        "architectures": ["LlamaForCausalLMEagle3"], "draft_vocab_size": vd, "hidden_act": "silu",
        "hidden_size": h, "intermediate_size": mlp, "max_position_embeddings": 256, "model_type": "llama",
        "num_attention_heads": heads, "num_hidden_layers": 1, "num_key_value_heads": kv,
        "rms_norm_eps": target_config.rms_norm_eps, "rope_scaling": None,
        "rope_theta": target_config.rope_parameters["rope_theta"], "tie_word_embeddings": False,
        "torch_dtype": "float16", "vocab_size": target_config.vocab_size, **edits,
    }  # fmt: skip
    gen = torch.Generator().manual_seed(seed)
    shapes = {"self_attn.q_proj": (h, 2 * h), "self_attn.k_proj": (kv * hd, 2 * h),
              "self_attn.v_proj": (kv * hd, 2 * h), "self_attn.o_proj": (h, h), "mlp.gate_proj": (mlp, h),
              "mlp.up_proj": (mlp, h), "mlp.down_proj": (h, mlp)}  # fmt: skip
    t = {"fc.weight": 2 * torch.randn(h, 3 * h, generator=gen) / math.sqrt(3 * h),
         "norm.weight": 1 + 0.3 * torch.randn(h, generator=gen),
         "lm_head.weight": 3 * torch.randn(vd, h, generator=gen) / math.sqrt(h)}  # fmt: skip
    for norm in ("hidden_norm", "input_layernorm", "post_attention_layernorm"):
        t[f"midlayer.{norm}.weight"] = 1 + 0.3 * torch.randn(h, generator=gen)
    for name in LAYER:
        rows, cols = shapes[name]
        t[f"midlayer.{name}.weight"] = 2 * torch.randn(rows, cols, generator=gen) / math.sqrt(cols)
    ids = torch.tensor(draft_ids)
    t["d2t"] = ids - torch.arange(vd)
    t["t2d"] = torch.zeros(config["vocab_size"], dtype=torch.bool).index_fill_(0, ids, True)
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config))
    torch.save(t, path / "pytorch_model.bin")
    return t


@torch.no_grad()
def head3_forward(t: dict, config, embeds: torch.Tensor, hidden: torch.Tensor, before: bool = False) -> torch.Tensor:
    """``cnets.Model.forward`` without a cache: ``hidden`` ``[1, N, 3H]`` (the target's fused layers, put through
    ``fc``) or ``[1, N, H]`` (the head's own outputs) beside ``embeds [1, N, H]`` -> the midlayer's output
    (``before``: speculators' ``norm_before_residual``, the residual taken after ``hidden_norm``)."""
    h, eps = config.hidden_size, config.rms_norm_eps
    if hidden.shape[-1] != h:
        hidden = F.linear(hidden, t["fc.weight"])
    w = {name: t[f"midlayer.{name}.weight"] for name in LAYER}
    normed = _rms(hidden, t["midlayer.hidden_norm.weight"], eps)
    x = torch.cat([_rms(embeds, t["midlayer.input_layernorm.weight"], eps), normed], -1)
    out = (normed if before else hidden) + _attention(config, x, w, h)
    return out + _mlp(_rms(out, t["midlayer.post_attention_layernorm.weight"], eps), w)


@torch.no_grad()
def first_draft3(t: dict, hf_model, prompt: list[int], steps: int, before: bool = False) -> list[int]:
    """EAGLE-3's greedy chain after ``prompt``: the target's hidden states entering layers ``2, L // 2, L - 3``
    (concatenated in that order), its next token; the head over ``(x_{i+1}, u_i)``, then ``steps`` times the argmax
    of ``lm_head(norm(g))`` mapped to a target id by ``d2t``, fed back with ``g`` (recomputed, not cached)."""
    layers = hf_model.config.num_hidden_layers
    out = hf_model.model(torch.tensor([prompt]), output_hidden_states=True)
    hidden = torch.cat([out.hidden_states[i] for i in (2, layers // 2, layers - 3)], -1)
    pending = int(hf_model.lm_head(out.last_hidden_state[0, -1]).argmax())
    tokens, drafted, embed = prompt[1:] + [pending], [], hf_model.model.embed_tokens
    for _ in range(steps):
        g = head3_forward(t, hf_model.config, embed(torch.tensor([tokens])), hidden, before)[0, -1]
        d = int(F.linear(_rms(g, t["norm.weight"], hf_model.config.rms_norm_eps), t["lm_head.weight"]).argmax())
        drafted.append(d + int(t["d2t"][d]))
        own = hidden if hidden.shape[-1] == g.shape[-1] else F.linear(hidden, t["fc.weight"])
        tokens, hidden = tokens + [drafted[-1]], torch.cat([own, g[None, None]], 1)
    return drafted


def write_speculators(path: Path, target_config, tensors: dict, norm_before_residual: bool) -> None:
    """The same EAGLE-3 head as vLLM's ``speculators`` saves it (``Eagle3Speculator.save_pretrained``):
    ``config.json`` with ``speculators_model_type: eagle3``, the layer's Llama config under
    ``transformer_layer_config``, ``draft_vocab_size``, ``norm_before_residual``, ``speculators_config``; and
    ``model.safetensors`` with ``layers.0.*`` where the authors write ``midlayer.*``."""
    from safetensors.torch import save_file

    h = target_config.hidden_size
    layer = {
        "architectures": ["LlamaForCausalLM"],
        "hidden_act": "silu",
        "hidden_size": h,
        "intermediate_size": target_config.intermediate_size,
        "max_position_embeddings": 256,
        "model_type": "llama",
        "num_attention_heads": target_config.num_attention_heads,
        "num_hidden_layers": 1,
        "num_key_value_heads": target_config.num_key_value_heads,
        "rms_norm_eps": target_config.rms_norm_eps,
        "rope_theta": target_config.rope_parameters["rope_theta"],
        "vocab_size": target_config.vocab_size,
    }
    proposal = {"proposal_type": "greedy", "speculative_tokens": 3}
    config = {
        "architectures": ["Eagle3Speculator"],
        "speculators_model_type": "eagle3",
        "transformer_layer_config": layer,
        "draft_vocab_size": int(tensors["lm_head.weight"].shape[0]),
        "norm_before_residual": norm_before_residual,
        "target_hidden_size": None,
        "eagle_aux_hidden_state_layer_ids": None,
        "speculators_version": "0.3.0",
        "speculators_config": {
            "algorithm": "eagle3",
            "default_proposal_method": "greedy",
            "proposal_methods": [proposal],
            "verifier": {"name_or_path": "tiny", "architectures": ["LlamaForCausalLM"]},
        },
    }
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config))
    renamed = {k.replace("midlayer.", "layers.0."): v.contiguous() for k, v in tensors.items()}
    save_file(renamed, str(path / "model.safetensors"))


def write_speculators_eagle(path: Path, target_config, tensors: dict, fusion_bias: bool) -> None:
    """The EAGLE-1 head of :func:`write_release` as ``speculators`` (up to 0.3) saved it: ``EagleSpeculator``'s
    ``config.json`` (``speculators_model_type: eagle``, ``layernorms: false``, ``fusion_bias``: HASS's setting, the
    layer's Llama config under ``transformer_layer_config``) and ``model.safetensors`` with ``fusion_fc.*`` and
    ``transformer.*`` (no embedding, no output head: the verifier's)."""
    from safetensors.torch import save_file

    layer = {
        "architectures": ["LlamaForCausalLM"], "attention_bias": False, "hidden_act": "silu",
        "hidden_size": target_config.hidden_size, "intermediate_size": target_config.intermediate_size,
        "max_position_embeddings": 256, "model_type": "llama",
        "num_attention_heads": target_config.num_attention_heads, "num_hidden_layers": 1,
        "num_key_value_heads": target_config.num_key_value_heads, "rms_norm_eps": target_config.rms_norm_eps,
        "rope_theta": target_config.rope_parameters["rope_theta"], "vocab_size": target_config.vocab_size,
    }  # fmt: skip
    config = {
        "architectures": ["EagleSpeculator"],
        "speculators_model_type": "eagle",
        "transformer_layer_architecture": "LlamaDecoderLayer",
        "transformer_layer_config": layer,
        "layernorms": False,
        "fusion_bias": fusion_bias,
        "speculators_version": "0.1.0",
        "speculators_config": {
            "algorithm": "eagle",
            "default_proposal_method": "greedy",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 5}],
            "verifier": {"name_or_path": "tiny", "architectures": ["LlamaForCausalLM"]},
        },
    }
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config))
    renamed = {k.replace("fc.", "fusion_fc.").replace("layers.0.", "transformer."): v for k, v in tensors.items()}
    if not fusion_bias:
        del renamed["fusion_fc.bias"]
    save_file(renamed, str(path / "model.safetensors"))


def first_round(lm, drafter, prompt: list[int], k: int) -> list[int]:
    """The tokens ``drafter`` proposes in its first round after ``prompt`` (a chain of ``k``), through ``generate``."""
    import decodekit as dk
    from decodekit.policies import FixedLength

    seen, original = [], drafter.propose

    def spy(state, budget):
        draft = original(state, budget)
        seen.append(draft.tokens[0].tolist())
        return draft

    drafter.propose = spy
    try:
        dk.generate(lm, [prompt], drafter, policy=FixedLength(k), max_new_tokens=2 * k, eos_token_id=())
    finally:
        del drafter.propose
    return seen[0]
