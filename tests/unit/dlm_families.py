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

from tests.word_tokenizer import save_word_tokenizer

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


ROLES = ("attn_norm", "q", "k", "v", "o", "mlp_norm", "gate", "up", "down")  # a block's tensors, in drawing order
# each family's tensor names: the model-level ones, then a block's ({i}: the block), by role
LLADA_NAMES = {
    "embed": "model.transformer.wte.weight",
    "norm": "model.transformer.ln_f.weight",
    "head": "model.transformer.ff_out.weight",
    **dict(zip(ROLES, (f"model.transformer.blocks.{{i}}.{n}.weight" for n in (
        "attn_norm", "q_proj", "k_proj", "v_proj", "attn_out", "ff_norm", "ff_proj", "up_proj", "ff_out")))),
}  # fmt: skip
DREAM_NAMES = {
    "embed": "model.embed_tokens.weight",
    "norm": "model.norm.weight",
    "head": "lm_head.weight",
    **dict(zip(ROLES, (f"model.layers.{{i}}.{n}.weight" for n in (
        "input_layernorm", "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
        "post_attention_layernorm", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")))),
}  # fmt: skip


def llada_dims(config: dict) -> dict:
    """LLaDA's config.json keys as the shared decoder's sizes."""
    return dict(d=config["d_model"], heads=config["n_heads"], kv=config["n_kv_heads"], mlp=config["mlp_hidden_size"],
                vocab=config["embedding_size"], layers=config["n_layers"], eps=config["rms_norm_eps"],
                theta=config["rope_theta"], tied=config["weight_tying"], bias=False)  # fmt: skip


def dream_dims(config: dict) -> dict:
    """Dream's config.json keys as the shared decoder's sizes (biases on q / k / v)."""
    return dict(d=config["hidden_size"], heads=config["num_attention_heads"], kv=config["num_key_value_heads"],
                mlp=config["intermediate_size"], vocab=config["vocab_size"], layers=config["num_hidden_layers"],
                eps=config["rms_norm_eps"], theta=config["rope_theta"], tied=config["tie_word_embeddings"],
                bias=True)  # fmt: skip


def random_tensors(names: dict, dims: dict, seed: int) -> dict[str, torch.Tensor]:
    """Random float32 weights under a family's ``names``: norm weights near 1, output weights large enough that
    logits are peaked (distinct argmaxes); with ``dims["bias"]`` q / k / v biases, each drawn after its weight."""
    gen = torch.Generator().manual_seed(seed)
    d, hd, kv = dims["d"], dims["d"] // dims["heads"], dims["kv"]

    def rand(*shape: int, scale: float = 1.0) -> torch.Tensor:
        return torch.randn(*shape, generator=gen) * scale / math.sqrt(shape[-1])

    shapes = {"q": (d, d, 2.0), "k": (kv * hd, d, 2.0), "v": (kv * hd, d, 1.0), "o": (d, d, 1.0),
              "gate": (dims["mlp"], d, 1.0), "up": (dims["mlp"], d, 1.0), "down": (d, dims["mlp"], 1.0)}  # fmt: skip
    t = {
        names["embed"]: torch.randn(dims["vocab"], d, generator=gen),
        names["norm"]: 1 + 0.1 * torch.randn(d, generator=gen),
    }
    if not dims["tied"]:
        t[names["head"]] = rand(dims["vocab"], d, scale=8.0)
    for i in range(dims["layers"]):
        for role in ROLES:
            name = names[role].format(i=i)
            if role.endswith("norm"):
                t[name] = 1 + 0.1 * torch.randn(d, generator=gen)
                continue
            rows, cols, scale = shapes[role]
            t[name] = rand(rows, cols, scale=scale)
            if dims["bias"] and role in "qkv":
                t[name.removesuffix("weight") + "bias"] = 0.1 * torch.randn(rows, generator=gen)
        for role in ("q_norm", "k_norm"):  # Qwen3's per-head norms (SDAR): drawn after the block, when named
            if role in names:
                t[names[role].format(i=i)] = 1 + 0.1 * torch.randn(hd, generator=gen)
    return t


def llada_tensors(config: dict, seed: int = 4) -> dict[str, torch.Tensor]:
    """LLaDA's weights (``LLaDAModelLM``: ``model.transformer.*``). Seed 4: greedy generation writes a dozen
    distinct tokens over two rows (seeds 0 and 1 write two to five)."""
    return random_tensors(LLADA_NAMES, llada_dims(config), seed)


def write_llada(path: Path, config: dict | None = None, layout: str = "safetensors", seed: int = 4) -> dict:
    """A LLaDA checkpoint directory: ``config.json``, the weights (``layout``: ``"safetensors"`` one file,
    ``"shards"`` two safetensors shards and their index, ``"bin"`` ``pytorch_model.bin``), tokenizer files, and
    poisoned ``modeling_llada.py`` / ``configuration_llada.py``. Returns the tensors written."""
    from safetensors.torch import save_file

    config = config or LLADA_CONFIG
    start_checkpoint(path, config, ("modeling_llada.py", "configuration_llada.py"))
    tensors = llada_tensors(config, seed)
    if layout == "safetensors":
        save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
    elif layout == "bin":
        torch.save(tensors, path / "pytorch_model.bin")
    else:
        save_shards(path, tensors)
    save_word_tokenizer(path, [f"w{i}" for i in range(config["vocab_size"])])
    return tensors


def start_checkpoint(path: Path, config: dict, code: tuple[str, ...]) -> None:
    """``path`` created with ``config.json`` and the family's ``code`` files, poisoned (they raise when imported)."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config, indent=2))
    for file in code:
        (path / file).write_text(POISON)


def save_shards(path: Path, tensors: dict[str, torch.Tensor]) -> None:
    """``tensors`` as two safetensors shards (alternate names) and their ``model.safetensors.index.json``, as the
    larger releases ship."""
    from safetensors.torch import save_file

    names = sorted(tensors)
    halves = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    weight_map = {}
    for file, keys in halves.items():
        save_file({k: tensors[k] for k in keys}, path / file, metadata={"format": "pt"})
        weight_map |= dict.fromkeys(keys, file)
    index = {"metadata": {"total_size": sum(t.numel() * 4 for t in tensors.values())}, "weight_map": weight_map}
    (path / "model.safetensors.index.json").write_text(json.dumps(index))


def _rotary(theta: float, head_dim: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``sin, cos [1, 1, length, head_dim]`` of rotate-half rotary embeddings at positions ``0 .. length-1``."""
    inv = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim)
    angles = torch.outer(torch.arange(length, dtype=torch.float), inv)
    angles = torch.cat((angles, angles), -1)
    return angles.sin()[None, None], angles.cos()[None, None]


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    x32 = x.float()
    return weight * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.unflatten(-1, (2, -1)).unbind(-2)
    return torch.cat((-x2, x1), dim=-1)


@torch.no_grad()
def decoder_forward(
    tensors: dict, names: dict, dims: dict, ids: torch.Tensor, causal: bool = False, mask: torch.Tensor | None = None
) -> torch.Tensor:
    """``ids [B, L]`` -> logits ``[B, L, V]`` (unshifted), the forward every reference computes with no cache: RMS
    norms (float32, scaled after casting back), per-head RMS norms on q / k where the family names them (Qwen3),
    rotary embeddings on q / k in float32 at positions ``0 .. L-1``, K/V heads repeated for grouped queries,
    attention under ``mask [L, L]`` (True: may attend; None: no mask; ``causal=True``: a deliberately wrong
    variant), a SiLU-gated MLP, the final norm and the output layer (or the tied embedding)."""
    d, heads, kv, eps = dims["d"], dims["heads"], dims["kv"], dims["eps"]
    hd, (batch, length) = d // heads, ids.shape
    sin, cos = _rotary(dims["theta"], hd, length)

    def linear(name: str, x: torch.Tensor) -> torch.Tensor:
        bias = tensors.get(name.removesuffix("weight") + "bias")
        return F.linear(x, tensors[name], bias)

    x = F.embedding(ids, tensors[names["embed"]])
    for i in range(dims["layers"]):
        n = {role: names[role].format(i=i) for role in ROLES}
        h = _rms(x, tensors[n["attn_norm"]], eps)
        q, k, v = (linear(n[r], h).view(batch, length, c, hd) for r, c in zip("qkv", (heads, kv, kv)))
        if "q_norm" in names:
            q, k = (_rms(u, tensors[names[r].format(i=i)], eps) for u, r in ((q, "q_norm"), (k, "k_norm")))
        q, k, v = (u.transpose(1, 2) for u in (q, k, v))
        q, k = (u.float() * cos + _rotate_half(u.float()) * sin for u in (q, k))
        k, v = k.repeat_interleave(heads // kv, 1), v.repeat_interleave(heads // kv, 1)
        att = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal)
        x = x + linear(n["o"], att.transpose(1, 2).reshape(batch, length, d))
        h = _rms(x, tensors[n["mlp_norm"]], eps)
        x = x + linear(n["down"], F.silu(linear(n["gate"], h)) * linear(n["up"], h))
    x = _rms(x, tensors[names["norm"]], eps)
    return x @ tensors[names["embed"] if dims["tied"] else names["head"]].T


def llada_forward(tensors: dict, config: dict, ids: torch.Tensor, causal: bool = False) -> torch.Tensor:
    """``LLaDAModel.forward`` with ``LLaDALlamaBlock``s and no cache (``modeling_llada.py``; rotary in float32 as
    ``rope_full_precision`` asks)."""
    return decoder_forward(tensors, LLADA_NAMES, llada_dims(config), ids, causal)


# Dream-v0-Instruct-7B's config.json, every key as released, sizes shrunk (2 layers, hidden 32, 4 heads of 8, GQA 2)
DREAM_CONFIG = {
    "architectures": ["DreamModel"],
    "attention_dropout": 0.0,
    "auto_map": {"AutoConfig": "configuration_dream.DreamConfig", "AutoModel": "modeling_dream.DreamModel"},
    "bos_token_id": 261,
    "eos_token_id": 261,
    "hidden_act": "silu",
    "hidden_size": 32,
    "initializer_range": 0.02,
    "intermediate_size": 48,
    "mask_token_id": 262,
    "max_position_embeddings": 256,
    "max_window_layers": 2,
    "model_type": "Dream",
    "num_attention_heads": 4,
    "num_hidden_layers": 2,
    "num_key_value_heads": 2,
    "pad_token_id": 261,
    "rms_norm_eps": 1e-06,
    "rope_scaling": None,
    "rope_theta": 1000000.0,
    "sliding_window": 256,
    "tie_word_embeddings": False,
    "torch_dtype": "float32",
    "transformers_version": "4.46.2",
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": 320,
}


def dream_tensors(config: dict, seed: int = 0) -> dict[str, torch.Tensor]:
    """Dream's weights (``DreamModel``: Qwen2's names, biases on q / k / v)."""
    return random_tensors(DREAM_NAMES, dream_dims(config), seed)


def save_dream_tokenizer(path: Path) -> None:
    """Dream's tokenizer files: a byte-level BPE (``vocab.json``: the 256 byte symbols and 5 merges, ids 0-260;
    ``merges.txt``), ``<|endoftext|>`` (261) and ``<|mask|>`` (262) as added tokens, and a
    ``tokenizer_config.json`` naming the repository's own ``DreamTokenizer`` class (whose file is poisoned)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    others = [b for b in range(256) if b not in printable]  # byte-level BPE's symbols: these move past 255
    symbols = {b: chr(b) for b in printable} | {b: chr(256 + n) for n, b in enumerate(others)}
    vocab = {symbols[b]: b for b in range(256)}
    merges = [("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("d", "e"), ("de", "f")]
    for a, b in merges:
        vocab[a + b] = len(vocab)
    (path / "vocab.json").write_text(json.dumps(vocab))
    (path / "merges.txt").write_text("#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges))
    special = {"261": "<|endoftext|>", "262": "<|mask|>"}  # right after the BPE vocabulary, as in Qwen2's
    added = {i: {"content": c, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False,
                 "special": True} for i, c in special.items()}  # fmt: skip
    tokenizer_config = {
        "added_tokens_decoder": added,
        "auto_map": {"AutoTokenizer": ["tokenization_dream.DreamTokenizer", None]},
        "bos_token": None,
        "eos_token": "<|endoftext|>",
        "pad_token": "<|endoftext|>",
        "mask_token": "<|mask|>",
        "model_max_length": 256,
        "tokenizer_class": "DreamTokenizer",
    }
    (path / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    (path / "tokenization_dream.py").write_text(POISON)


def write_dream(path: Path, config: dict | None = None, seed: int = 0) -> dict:
    """A Dream checkpoint directory: ``config.json``, ``model.safetensors``, the tokenizer files, and poisoned
    ``modeling_dream.py`` / ``configuration_dream.py`` / ``generation_utils.py``. Returns the tensors written."""
    from safetensors.torch import save_file

    config = config or DREAM_CONFIG
    start_checkpoint(path, config, ("modeling_dream.py", "configuration_dream.py", "generation_utils.py"))
    tensors = dream_tensors(config, seed)
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
    save_dream_tokenizer(path)
    return tensors


def dream_forward(tensors: dict, config: dict, ids: torch.Tensor, causal: bool = False) -> torch.Tensor:
    """``DreamModel.forward`` with SDPA attention and no cache (``modeling_dream.py``: default rotary, cos / sin in
    float32, applied to the float32 q / k here as there; ``is_causal=False``)."""
    return decoder_forward(tensors, DREAM_NAMES, dream_dims(config), ids, causal)


def dream_generate(
    forward, prompt: list[int], gen_length: int, steps: int, alg: str, mask: int, eps: float = 1e-3, generator=None
):
    """Dream's ``diffusion_generate`` at temperature 0 (``generation_utils.py``, ``_sample``; ``alg_temp`` None),
    one row: each step runs the whole canvas, shifts the logits one slot right (slot 0 keeps its own) and takes the
    masked slots' argmax proposals. ``alg`` ``maskgit_plus``, ``topk_margin`` or ``entropy``: it commits the
    ``int(n (1 - s / t))`` most confident (all at the last step) on ``t = linspace(1, eps, steps + 1)``;
    ``"origin"``: each masked slot with probability ``1 - s / t`` (1 at the last step), by ``torch.rand(n) <
    p_transfer`` drawn from ``generator`` (what ``torch.manual_seed`` makes the reference's global one). Returns the
    generated tokens and the forwards taken (steps that commit nothing included, as there)."""
    x = torch.tensor([prompt + [mask] * gen_length])
    grid = torch.linspace(1, eps, steps + 1)
    for i in range(steps):
        masked = x == mask
        logits = forward(x)
        logits = torch.cat([logits[:, :1], logits[:, :-1]], dim=1)
        probs = torch.softmax(logits[masked], dim=-1)
        confidence, proposed = probs.max(dim=-1)
        if alg == "origin":
            p_transfer = 1 - grid[i + 1] / grid[i] if i < steps - 1 else 1
            filled = torch.full_like(x[masked], mask)
            transfer = torch.rand(*filled.shape, generator=generator) < p_transfer
            filled[transfer] = proposed[transfer]
            x[masked] = filled
            continue
        if alg == "topk_margin":
            top = torch.sort(probs, dim=-1, descending=True).values
            confidence = top[:, 0] - top[:, 1]
        elif alg == "entropy":
            confidence = torch.sum(probs * torch.log(probs + 1e-10), dim=-1)
        n = masked.sum() / masked.shape[0]
        count = int(n * (1 - grid[i + 1] / grid[i])) if i < steps - 1 else int(n)
        full = torch.full(x.shape, -torch.inf)
        full[masked] = confidence
        if count > 0:
            chosen = torch.topk(full, count).indices
            filled = torch.full_like(x, mask)
            filled[masked] = proposed
            x[0, chosen[0]] = filled[0, chosen[0]]
    return x[0, len(prompt) :].tolist(), steps


def block_mask(length: int, block: int) -> torch.Tensor:
    """``[L, L]`` bool: the block-causal mask SDAR's ``generate.py`` and Fast-dLLM v2's ``eval_block_diff_mask`` build
    on the absolute grid: query ``i`` sees key ``j`` iff ``j // block <= i // block``."""
    blocks = torch.arange(length) // block
    return blocks[None, :] <= blocks[:, None]


def qwen_dims(config: dict, bias: bool) -> dict:
    """A Qwen2 / Qwen3 ``config.json``'s sizes for the shared decoder."""
    return dict(d=config["hidden_size"], heads=config["num_attention_heads"], kv=config["num_key_value_heads"],
                mlp=config["intermediate_size"], vocab=config["vocab_size"], layers=config["num_hidden_layers"],
                eps=config["rms_norm_eps"], theta=config["rope_theta"], tied=config["tie_word_embeddings"],
                bias=bias)  # fmt: skip


def write_qwen_family(
    path: Path, config: dict, names: dict, bias: bool, code: tuple[str, ...], seed: int, mask: int
) -> dict:
    """A Qwen-derived checkpoint directory: ``config.json``, ``model.safetensors`` (the ``mask`` token's output row
    zeroed: a trained DLM never proposes it, and the references, unlike decodekit, would), poisoned ``code`` files.
    Returns the tensors written."""
    from safetensors.torch import save_file

    start_checkpoint(path, config, code)
    tensors = random_tensors(names, qwen_dims(config, bias), seed)
    tensors["lm_head.weight"][mask] = 0
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
    return tensors


# SDAR-4B-Chat's config.json keys as released (Qwen3's, plus block_size / mask_token_id / fuse_cross_entropy), sizes
# shrunk (2 layers, hidden 32, 4 heads of 8, GQA 2; blocks of 4)
SDAR_CONFIG = {
    "architectures": ["SDARForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "auto_map": {
        "AutoConfig": "configuration_sdar.SDARConfig",
        "AutoModel": "modeling_sdar.SDARModel",
        "AutoModelForCausalLM": "modeling_sdar.SDARForCausalLM",
    },  # fmt: skip
    "block_size": 4,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "fuse_cross_entropy": True,
    "head_dim": 8,
    "hidden_act": "silu",
    "hidden_size": 32,
    "initializer_range": 0.02,
    "intermediate_size": 48,
    "mask_token_id": 127,
    "max_position_embeddings": 256,
    "max_window_layers": 2,
    "model_type": "sdar",
    "num_attention_heads": 4,
    "num_hidden_layers": 2,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-06,
    "rope_scaling": None,
    "rope_theta": 1000000.0,
    "sliding_window": None,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.52.4",
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": 128,
}
SDAR_NAMES = DREAM_NAMES | {r: f"model.layers.{{i}}.self_attn.{r}.weight" for r in ("q_norm", "k_norm")}


def write_sdar(path: Path, config: dict | None = None, seed: int = 0) -> dict:
    """An SDAR checkpoint directory: Qwen3's tensor names, a word tokenizer whose mask token is ``<|MASK|>``, and
    poisoned ``modeling_sdar.py`` / ``configuration_sdar.py``."""
    config = config or SDAR_CONFIG
    code = ("modeling_sdar.py", "configuration_sdar.py")
    tensors = write_qwen_family(path, config, SDAR_NAMES, False, code, seed, config["mask_token_id"])
    words = [f"w{i}" for i in range(config["vocab_size"] - 1)] + ["<|MASK|>"]
    save_word_tokenizer(path, words, mask_token="<|MASK|>")
    return tensors


def sdar_forward(tensors: dict, config: dict, ids: torch.Tensor, causal: bool = False) -> torch.Tensor:
    """SDAR's forward as ``generate.py`` drives it, without a cache: Qwen3's decoder (q / k norms per head) under the
    absolute block-causal mask it passes (``block_size`` blocks from position 0)."""
    mask = None if causal else block_mask(ids.shape[1], config["block_size"])
    return decoder_forward(tensors, SDAR_NAMES, qwen_dims(config, False), ids, causal, mask)


def sdar_generate(forward, prompt: list[int], mask: int, gen_length: int, block: int, steps: int, strategy: str,
                  threshold: float = 0.85, greedy: str = "top_k") -> list[int]:  # fmt: skip
    """SDAR's ``block_diffusion_generate`` (JetAstra/SDAR ``generate.py`` @ c2041a8), one row, with each block's
    forward recomputed over the canvas so far (the same K/V the reference keeps: nothing before a block sees it).
    ``greedy="top_k"``: its sampler at ``top_k=1`` (the argmax, probability 1); ``"argmax"``: the argmax and its
    softmax probability (the one change: decodekit's temperature 0). Returns the first ``gen_length`` tokens."""
    length = len(prompt)
    blocks = -(-(length + gen_length) // block)
    x = torch.full((blocks * block,), mask)
    x[:length] = torch.tensor(prompt)
    counts = [block // steps + (i < block % steps) for i in range(steps)]
    for b in range(length // block, blocks):
        lo, hi = b * block, (b + 1) * block
        for step in range(steps + 1):
            masked = x[lo:hi] == mask
            if not masked.any():
                break
            logits = forward(x[None, :hi])[0, lo:hi]
            probs = logits.softmax(-1)
            x0 = probs.argmax(-1)
            x0_p = torch.ones(block) if greedy == "top_k" else probs.gather(-1, x0[:, None])[:, 0]
            n = counts[step]
            transfer = torch.zeros(block, dtype=torch.bool)
            confidence = torch.where(masked, x0_p, -torch.inf)
            if strategy == "sequential":
                first = int(masked.nonzero()[0])
                transfer[first : first + n] = True
            elif strategy == "low_confidence_static":
                transfer[torch.topk(confidence, n).indices] = True
            else:
                sure = confidence > threshold
                if sure.sum() >= n:
                    transfer = sure
                else:
                    transfer[torch.topk(confidence, n).indices] = True
            x[lo:hi] = torch.where(transfer, x0, x[lo:hi])
    return x[length : length + gen_length].tolist()


# Fast_dLLM_v2_7B's config.json keys as released (Qwen2.5's, plus bd_size; no mask id: the tokenizer's |<MASK>|),
# sizes shrunk (2 layers, hidden 32, 4 heads of 8, GQA 2; blocks of 8)
FAST_DLLM_V2_CONFIG = {
    "architectures": ["Fast_dLLM_QwenForCausalLM"],
    "attention_dropout": 0.0,
    "auto_map": {
        "AutoConfig": "configuration.Fast_dLLM_QwenConfig",
        "AutoModel": "modeling.Fast_dLLM_QwenModel",
        "AutoModelForCausalLM": "modeling.Fast_dLLM_QwenForCausalLM",
    },  # fmt: skip
    "bd_size": 8,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "hidden_act": "silu",
    "hidden_size": 32,
    "initializer_range": 0.02,
    "intermediate_size": 48,
    "layer_types": ["full_attention", "full_attention"],
    "max_position_embeddings": 256,
    "max_window_layers": 2,
    "model_type": "Fast_dLLM_Qwen",
    "num_attention_heads": 4,
    "num_hidden_layers": 2,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-06,
    "rope_scaling": None,
    "rope_theta": 1000000.0,
    "sliding_window": None,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.53.1",
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": 128,
}
FAST_DLLM_V2_MASK = 125  # where the word tokenizer puts |<MASK>|


def write_fast_dllm_v2(path: Path, config: dict | None = None, seed: int = 0) -> dict:
    """A Fast-dLLM v2 checkpoint directory: Qwen2's tensor names, a word tokenizer holding ``|<MASK>|`` (id 125),
    and poisoned ``modeling.py`` / ``configuration.py``."""
    config = config or FAST_DLLM_V2_CONFIG
    code = ("modeling.py", "configuration.py")
    tensors = write_qwen_family(path, config, DREAM_NAMES, True, code, seed, FAST_DLLM_V2_MASK)
    words = [f"w{i}" for i in range(config["vocab_size"])]
    words[FAST_DLLM_V2_MASK] = "|<MASK>|"
    save_word_tokenizer(path, words)
    return tensors


def fast_dllm_v2_forward(tensors: dict, config: dict, ids: torch.Tensor, causal: bool = False) -> torch.Tensor:
    """Fast-dLLM v2's inference forward without a cache (``modeling.py``: Qwen2's decoder under
    ``eval_block_diff_mask``, query block >= key block, blocks of ``bd_size``), unshifted."""
    mask = None if causal else block_mask(ids.shape[1], config["bd_size"])
    return decoder_forward(tensors, DREAM_NAMES, qwen_dims(config, True), ids, causal, mask)


def fast_dllm_v2_generate(forward, prompt: list[int], mask: int, gen_length: int, block: int, small: int,
                          threshold: float) -> list[int]:  # fmt: skip
    """Fast-dLLM v2's ``generate`` at temperature 0 without its sub-block cache (``modeling.py`` of the copy named
    in ``decodekit.dlm.families.fast_dllm_v2``), one row, every forward recomputed over the canvas so far (the K/V
    it caches: block-causal, nothing earlier sees a later block): a prompt of whole blocks (longer than one) gets
    its next token from the prefill's last output; each block is padded with masks to its end and decoded in
    sub-blocks of ``small`` (logits shifted one slot right, the first keeping its own; every masked slot of the
    sub-block above ``threshold`` and always the most probable); a finished block's last output gives the next
    block's first token. No stop token. Returns the first ``gen_length`` tokens."""
    x = torch.tensor(prompt)
    if len(x) > block and len(x) % block == 0:
        x = torch.cat([x, forward(x[None])[0, -1:].argmax(-1)])
    while len(x) < len(prompt) + gen_length:
        xt = torch.cat([x, torch.full((block - len(x) % block,), mask)])
        for start in range(0, block, small):
            while True:
                sub = xt[-block:][start : start + small]
                open_ = sub == mask
                if not open_.any():
                    break
                logits = forward(xt[None])[0, -block:]
                logits = torch.cat([logits[:1], logits[:-1]])[start : start + small]
                probs = logits.softmax(-1)
                x1 = probs.argmax(-1)
                p = torch.where(open_, probs.gather(-1, x1[:, None])[:, 0], -torch.inf)
                take = p > threshold
                take[p.argmax()] = True
                take &= open_
                xt[len(xt) - block + start : len(xt) - block + start + small] = torch.where(take, x1, sub)
        x = torch.cat([xt, forward(xt[None])[0, -1:].argmax(-1)])
    return x[len(prompt) : len(prompt) + gen_length].tolist()
