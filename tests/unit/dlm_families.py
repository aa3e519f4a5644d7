"""Tiny random checkpoints written in the published DLM families' exact on-disk layouts, and our own ports of the
families' reference forwards (see each function for the file it transcribes; written here, not copied).

Every checkpoint directory also holds the family's modeling code files, as the released repositories do, replaced
by files that raise when imported: loading must never execute them.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
import torch.nn.functional as F

POISON = 'raise RuntimeError("decodekit imported code shipped with a checkpoint")\n'

# LLaDA-8B-Instruct's config.json, every key as released, sizes shrunk (tiny: 2 blocks, d 32, 4 heads of 8, GQA 2)
LLADA_CONFIG = {
    "activation_type": "silu",
    "alibi": False,
    "alibi_bias_max": 8.0,
    "architectures": ["LLaDAModelLM"],
    "attention_dropout": 0.0,
    "attention_layer_norm": False,
    "attention_layer_norm_with_affine": True,
    "auto_map": {
        "AutoConfig": "configuration_llada.LLaDAConfig",
        "AutoModelForCausalLM": "modeling_llada.LLaDAModelLM",
        "AutoModel": "modeling_llada.LLaDAModelLM",
    },
    "bias_for_layer_norm": False,
    "block_group_size": 1,
    "block_type": "llama",
    "d_model": 32,
    "embedding_dropout": 0.0,
    "embedding_size": 128,
    "eos_token_id": 126,
    "flash_attention": False,
    "include_bias": False,
    "include_qkv_bias": False,
    "init_cutoff_factor": None,
    "init_device": "meta",
    "init_fn": "mitchell",
    "init_std": 0.02,
    "input_emb_norm": False,
    "layer_norm_type": "rms",
    "layer_norm_with_affine": True,
    "mask_token_id": 127,
    "max_sequence_length": 256,
    "mlp_hidden_size": 48,
    "mlp_ratio": 4,
    "model_type": "llada",
    "multi_query_attention": None,
    "n_heads": 4,
    "n_kv_heads": 2,
    "n_layers": 2,
    "pad_token_id": 126,
    "precision": "amp_bf16",
    "residual_dropout": 0.0,
    "rms_norm_eps": 1e-05,
    "rope": True,
    "rope_full_precision": True,
    "rope_theta": 500000.0,
    "scale_logits": False,
    "transformers_version": "4.46.3",
    "use_cache": False,
    "vocab_size": 128,
    "weight_tying": False,
}


def llada_tensors(config: dict, seed: int = 4) -> dict[str, torch.Tensor]:
    """Random weights under LLaDA's parameter names (``LLaDAModelLM``: ``model.transformer.*``), float32; norm weights
    near 1 and output weights large enough that logits are peaked (distinct argmaxes). Seed 4: greedy generation
    writes a dozen distinct tokens over two rows (seeds 0 and 1 write two to five)."""
    gen = torch.Generator().manual_seed(seed)
    d, heads, kv = config["d_model"], config["n_heads"], config["n_kv_heads"]
    hd, mlp, vocab = d // heads, config["mlp_hidden_size"], config["embedding_size"]

    def rand(*shape: int, scale: float = 1.0) -> torch.Tensor:
        return torch.randn(*shape, generator=gen) * scale / math.sqrt(shape[-1])

    def norm() -> torch.Tensor:
        return 1 + 0.1 * torch.randn(d, generator=gen)

    t = {"model.transformer.wte.weight": torch.randn(vocab, d, generator=gen), "model.transformer.ln_f.weight": norm()}
    if not config["weight_tying"]:
        t["model.transformer.ff_out.weight"] = rand(vocab, d, scale=8.0)
    for i in range(config["n_layers"]):
        b = f"model.transformer.blocks.{i}."
        t |= {
            b + "attn_norm.weight": norm(),
            b + "q_proj.weight": rand(d, d, scale=2.0),
            b + "k_proj.weight": rand(kv * hd, d, scale=2.0),
            b + "v_proj.weight": rand(kv * hd, d),
            b + "attn_out.weight": rand(d, d),
            b + "ff_norm.weight": norm(),
            b + "ff_proj.weight": rand(mlp, d),
            b + "up_proj.weight": rand(mlp, d),
            b + "ff_out.weight": rand(d, mlp),
        }
    return t


def save_tokenizer(path: Path, vocab: int) -> None:
    """A word-level tokenizer over ``vocab`` ids (``w0 .. w{vocab-1}``), as ``save_pretrained`` writes it."""
    import tokenizers
    from transformers import PreTrainedTokenizerFast

    words = {f"w{i}": i for i in range(vocab)}
    backend = tokenizers.Tokenizer(tokenizers.models.WordLevel(words, unk_token="w0"))
    backend.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="w0").save_pretrained(path)


def write_llada(path: Path, config: dict | None = None, layout: str = "safetensors", seed: int = 4) -> dict:
    """A LLaDA checkpoint directory: ``config.json``, the weights (``layout``: ``"safetensors"`` one file,
    ``"shards"`` two safetensors shards and their index, ``"bin"`` ``pytorch_model.bin``), tokenizer files, and
    poisoned ``modeling_llada.py`` / ``configuration_llada.py``. Returns the tensors written."""
    from safetensors.torch import save_file

    config = config or LLADA_CONFIG
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config, indent=2))
    for code in ("modeling_llada.py", "configuration_llada.py"):
        (path / code).write_text(POISON)
    tensors = llada_tensors(config, seed)
    if layout == "safetensors":
        save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
    elif layout == "bin":
        torch.save(tensors, path / "pytorch_model.bin")
    else:
        names = sorted(tensors)
        halves = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
        weight_map = {}
        for file, keys in halves.items():
            save_file({k: tensors[k] for k in keys}, path / file, metadata={"format": "pt"})
            weight_map |= dict.fromkeys(keys, file)
        index = {"metadata": {"total_size": sum(t.numel() * 4 for t in tensors.values())}, "weight_map": weight_map}
        (path / "model.safetensors.index.json").write_text(json.dumps(index))
    save_tokenizer(path, config["vocab_size"])
    return tensors


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    x32 = x.float()
    return weight * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.unflatten(-1, (2, -1)).unbind(-2)
    return torch.cat((-x2, x1), dim=-1)


@torch.no_grad()
def llada_forward(tensors: dict, config: dict, ids: torch.Tensor, causal: bool = False) -> torch.Tensor:
    """``ids [B, L]`` -> logits ``[B, L, V]``: ``LLaDAModel.forward`` with ``LLaDALlamaBlock``s and no cache
    (``modeling_llada.py``): positions ``0 .. L-1``, rotary on float32 q/k (``rope_full_precision``), K/V heads
    repeated for grouped queries, attention with no mask (``causal=True``: a deliberately wrong variant)."""
    t = {k.removeprefix("model.transformer."): v for k, v in tensors.items()}
    d, heads, kv, eps = config["d_model"], config["n_heads"], config["n_kv_heads"], config["rms_norm_eps"]
    hd, (batch, length) = d // heads, ids.shape
    inv = 1.0 / config["rope_theta"] ** (torch.arange(0, hd, 2, dtype=torch.float) / hd)
    angles = torch.outer(torch.arange(length, dtype=torch.float), inv)
    angles = torch.cat((angles, angles), -1)
    sin, cos = angles.sin()[None, None], angles.cos()[None, None]
    x = F.embedding(ids, t["wte.weight"])
    for i in range(config["n_layers"]):
        b = {k.removeprefix(f"blocks.{i}."): v for k, v in t.items() if k.startswith(f"blocks.{i}.")}
        h = _rms(x, b["attn_norm.weight"], eps)
        q = (h @ b["q_proj.weight"].T).view(batch, length, heads, hd).transpose(1, 2)
        k = (h @ b["k_proj.weight"].T).view(batch, length, kv, hd).transpose(1, 2)
        v = (h @ b["v_proj.weight"].T).view(batch, length, kv, hd).transpose(1, 2)
        q, k = (u.float() * cos + _rotate_half(u.float()) * sin for u in (q, k))
        k, v = k.repeat_interleave(heads // kv, 1), v.repeat_interleave(heads // kv, 1)
        att = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        x = x + att.transpose(1, 2).reshape(batch, length, d) @ b["attn_out.weight"].T
        h = _rms(x, b["ff_norm.weight"], eps)
        x = x + (F.silu(h @ b["ff_proj.weight"].T) * (h @ b["up_proj.weight"].T)) @ b["ff_out.weight"].T
    x = _rms(x, t["ln_f.weight"], eps)
    return x @ (t["wte.weight"] if config["weight_tying"] else t["ff_out.weight"]).T
