"""The DFlash head (:class:`DFlashHead`): a few bidirectional decoder layers that denoise a block of mask slots in one
forward, their keys and values over the context computed from the target's fused hidden states (KV injection).

Reconstructed from z-lab/dflash ``dflash/model.py`` (read at 44947fb, ``DFlashDraftModel``) and the paper (Chen,
Liang, Liu 2026, arXiv 2602.06036). For a committed position ``t`` the target's outputs of a few layers are
concatenated and fused, ``c_t = norm_c(fc([h^(l_1)_t ; ... ; h^(l_n)_t]))``. Each head layer is a pre-norm
decoder layer (RMSNorm, attention with per-head query / key RMSNorms and RoPE, SwiGLU MLP) whose queries come from
the block and whose keys and values come from the context *and* the block:

    K = k_norm(W_k [c_{0..s-1} ; norm(x)]),   V = W_v [c_{0..s-1} ; norm(x)],   Q = q_norm(W_q norm(x))

with no causal mask (every slot sees the whole context and the whole block). The block ``x`` holds the embedding of
the pending token (the last committed one, position ``s``) and ``block_size - 1`` mask slots after it; the output
at slot ``j`` (after a final norm and the target's output head) is the draft of the token at ``s + j``. Since
``c`` never changes along the layers, each layer's context keys and values are computed once, when the position is
committed, and kept in a :class:`~decodekit.cache.KVCache` across rounds.

Faithfulness: the reference's layer, fusion, KV injection, positions and non-causal block attention (a test
compares the block logits with a hand transcription of the reference's forward on a tiny target). Ours: the mask
slots read a learned ``mask_embedding`` (the reference embeds a mask token id of the target's vocabulary, which a
causal LM such as SmolLM2 does not have); draft logits may be trimmed to a draft vocabulary (the reference scores
the full vocabulary: ``vocab`` = all ids does the same).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from decodekit.checks import check_int
from decodekit.models.grouped_attention import grouped_attention

__all__ = ["DFlashHead", "DFlashLayer", "default_layers"]


def default_layers(num_target_layers: int, num_head_layers: int) -> tuple[int, ...]:
    """The target layers a head of ``num_head_layers`` layers reads by default (1-based outputs): the reference's
    choice, the middle layer for one head layer, else ``num_head_layers`` layers spread evenly from the second
    layer to the fourth from last."""
    if num_head_layers == 1:
        return (num_target_layers // 2 + 1,)
    start, end = 1, num_target_layers - 3
    return tuple(int(round(start + i * (end - start) / (num_head_layers - 1))) + 1 for i in range(num_head_layers))


def _rms_norm(size: int, eps: float) -> nn.RMSNorm:
    return nn.RMSNorm(size, eps=eps)


class DFlashLayer(nn.Module):
    """One head layer (module docstring); sizes from the target's transformers ``config``."""

    def __init__(self, config: Any) -> None:
        super().__init__()
        hidden, eps = int(config.hidden_size), float(getattr(config, "rms_norm_eps", 1e-6))
        self.heads = int(config.num_attention_heads)
        self.kv_heads = int(getattr(config, "num_key_value_heads", None) or self.heads)
        self.head_dim = int(getattr(config, "head_dim", None) or hidden // self.heads)
        bias = bool(getattr(config, "attention_bias", False))
        self.q_proj = nn.Linear(hidden, self.heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(hidden, self.kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(hidden, self.kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.heads * self.head_dim, hidden, bias=bias)
        self.q_norm, self.k_norm = _rms_norm(self.head_dim, eps), _rms_norm(self.head_dim, eps)
        self.input_layernorm, self.post_attention_layernorm = _rms_norm(hidden, eps), _rms_norm(hidden, eps)
        inner = int(config.intermediate_size)
        self.gate_proj = nn.Linear(hidden, inner, bias=False)
        self.up_proj = nn.Linear(hidden, inner, bias=False)
        self.down_proj = nn.Linear(inner, hidden, bias=False)

    def keys_values(
        self, h: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``h [B, M, H]`` (fused context features, or the block's normed inputs) -> keys and values
        ``[B, H_kv, M, D]``, the keys normed and rotated by ``rope`` (cos, sin ``[B, M, D]``)."""
        batch, m, _ = h.shape
        k = self.k_norm(self.k_proj(h).view(batch, m, self.kv_heads, self.head_dim)).transpose(1, 2)
        v = self.v_proj(h).view(batch, m, self.kv_heads, self.head_dim).transpose(1, 2)
        return _rotate(k, *rope), v

    def forward(
        self,
        x: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor],
        past: tuple[torch.Tensor, torch.Tensor],
        mask: torch.Tensor,
    ) -> torch.Tensor:
        """``x [B, N, H]`` (the block) attending to the context's ``past`` keys and values ``[B, H_kv, S, D]`` and
        to the block's own, under ``mask [B, 1, N, S + N]`` (bool, True = attend) -> ``[B, N, H]``."""
        batch, n, _ = x.shape
        h = self.input_layernorm(x)
        q = self.q_norm(self.q_proj(h).view(batch, n, self.heads, self.head_dim)).transpose(1, 2)
        q = _rotate(q, *rope)
        k, v = self.keys_values(h, rope)
        out = grouped_attention(q, torch.cat([past[0], k], 2), torch.cat([past[1], v], 2), mask)
        x = x + self.o_proj(out.transpose(1, 2).reshape(batch, n, -1))
        h = self.post_attention_layernorm(x)
        return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))


def _rotate(t: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE on ``t [B, heads, M, D]`` with ``cos``, ``sin [B, M, D]`` (transformers' half-rotation convention)."""
    cos, sin = cos[:, None].to(t.dtype), sin[:, None].to(t.dtype)
    half = t.shape[-1] // 2
    rotated = torch.cat([-t[..., half:], t[..., :half]], -1)
    return t * cos + rotated * sin


class DFlashHead(nn.Module):
    """The DFlash draft head for a target (module docstring).

    Args:
        config: the target's transformers config (sizes, norms' epsilon, RoPE settings).
        layers: the target layers (1-based outputs) whose states are fused into the context features.
        num_layers: head layers.
        block_size: slots per drafted block, the pending token's included (drafts of up to ``block_size - 1``).
        vocab: ``[V_d]`` the token ids the head scores (None: the whole vocabulary).
    """

    def __init__(
        self,
        config: Any,
        layers: Sequence[int],
        num_layers: int = 1,
        block_size: int = 8,
        vocab: torch.Tensor | None = None,
    ) -> None:
        super().__init__()
        from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

        check_int("num_layers", num_layers, low=1, hint=" (the head's decoder layers)")
        check_int("block_size", block_size, low=2, hint=" (the pending token and at least one slot to draft)")
        hidden, eps = int(config.hidden_size), float(getattr(config, "rms_norm_eps", 1e-6))
        self.target_layers, self.block_size = tuple(int(i) for i in layers), int(block_size)
        self.fc = nn.Linear(len(self.target_layers) * hidden, hidden, bias=False)
        self.hidden_norm = _rms_norm(hidden, eps)
        self.layers = nn.ModuleList(DFlashLayer(config) for _ in range(num_layers))
        self.norm = _rms_norm(hidden, eps)
        self.mask_embedding = nn.Parameter(torch.zeros(hidden))
        head_dim = self.layers[0].head_dim
        rope_config = config if getattr(config, "head_dim", None) == head_dim else _with_head_dim(config, head_dim)
        self.rotary = LlamaRotaryEmbedding(config=rope_config)
        self.register_buffer("vocab", torch.arange(int(config.vocab_size)) if vocab is None else vocab.long())

    def context(self, taps: torch.Tensor) -> torch.Tensor:
        """``taps [B, M, len(layers) * H]`` (the target layers' outputs, concatenated) -> ``c [B, M, H]``."""
        return self.hidden_norm(self.fc(taps.to(self.fc.weight.dtype)))

    def context_kv(self, c: torch.Tensor, positions: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Each layer's keys and values ``[B, H_kv, M, D]`` of the context features ``c [B, M, H]`` at
        ``positions [B, M]``: what the cache keeps for a committed position."""
        rope = self.rotary(c, positions)  # cos, sin [B, M, D]
        return [layer.keys_values(c, rope) for layer in self.layers]

    def block_inputs(self, embeds: torch.Tensor, slots: int) -> torch.Tensor:
        """``[B, slots, H]``: the pending tokens' embeddings ``embeds [B, H]``, then ``slots - 1`` mask slots."""
        mask = self.mask_embedding.to(embeds.dtype).expand(embeds.shape[0], slots - 1, -1)
        return torch.cat([embeds[:, None], mask], 1)

    def forward(
        self,
        x: torch.Tensor,
        positions: torch.Tensor,
        past: list[tuple[torch.Tensor, torch.Tensor]],
        mask: torch.Tensor,
    ) -> torch.Tensor:
        """The block ``x [B, N, H]`` at ``positions [B, N]`` against each layer's context ``past`` keys and values
        (``[B, H_kv, S, D]``, :meth:`context_kv`) under ``mask [B, 1, N, S + N]`` -> normed ``[B, N, H]`` (slot
        ``j``'s output predicts the token ``j`` after the block's first position)."""
        rope = self.rotary(x, positions)
        for layer, kv in zip(self.layers, past):
            x = layer(x, rope, kv, mask)
        return self.norm(x)

    @torch.no_grad()
    def init_from(self, target: Any) -> None:
        """Start from the target: each layer's projections and norms from the target's last decoder layer where
        the shapes agree (Llama-family layers), ``fc`` an average of the tapped states, the mask slots the mean
        token embedding."""
        source = getattr(target, "layers", None)
        if source is not None:
            theirs = dict(source[-1].named_parameters())
            for layer in self.layers:
                for name, param in layer.named_parameters():
                    for key in (f"self_attn.{name}", f"mlp.{name}", name):
                        if key in theirs and theirs[key].shape == param.shape:
                            param.copy_(theirs[key])
                            break
        hidden = self.fc.out_features
        eye = torch.eye(hidden) / len(self.target_layers)
        self.fc.weight.copy_(torch.cat([eye] * len(self.target_layers), 1) + 0.01 * torch.randn_like(self.fc.weight))
        weight = getattr(getattr(target, "hf", None), "get_input_embeddings", lambda: None)()
        if weight is not None:
            self.mask_embedding.copy_(weight.weight.detach().float().mean(0).to(self.mask_embedding))

    def file_fields(self) -> dict[str, Any]:
        """What a head file records of the architecture (:func:`~decodekit.drafters.dflash.load_dflash` reads it)."""
        return {
            "architecture": "dflash",
            "layers": list(self.target_layers),
            "head_layers": len(self.layers),
            "block_size": self.block_size,
        }

    def save(self, path: Any, metadata: dict[str, Any]) -> None:
        """Write the weights (float16) and ``metadata`` (:func:`~decodekit.drafters.head_files.head_metadata`)."""
        from decodekit.drafters.head_files import save_head

        save_head(self, path, metadata)


def _with_head_dim(config: Any, head_dim: int) -> Any:
    import copy

    config = copy.deepcopy(config)
    config.head_dim = head_dim
    return config
