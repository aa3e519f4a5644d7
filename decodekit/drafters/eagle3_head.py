"""The EAGLE-3 draft head's module, as its authors compute it (SafeAILab/EAGLE ``eagle/model/cnets.py``,
``LlamaDecoderLayeremb``): :class:`Eagle3ReleaseHead`. The attention input is
``[input_layernorm(embed(x_{t+1})) ; hidden_norm(u_t)]`` (``2H`` wide), the residual is ``u_t`` itself, then the
post-attention norm and the MLP; the draft logits are ``lm_head(norm(g))`` over its own draft vocabulary, and at draft
positions the head reads its own (un-normed) output ``g``. ``u_t`` fuses the target's hidden states entering layers
``2, L // 2, L - 3`` (:func:`default_layers`). A released head's files are read by
:mod:`decodekit.drafters.eagle3_release`; a head trained by ``train recipe=eagle3`` is this module too.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from decodekit.drafters.lean_layer import compiled_step
from decodekit.models.base import LanguageModel
from decodekit.models.grouped_attention import grouped_attention


def default_layers(num_layers: int) -> tuple[int, int, int]:
    """EAGLE-3's three taps for an ``num_layers``-layer target: the outputs of layers 2, ``num_layers // 2`` and
    ``num_layers - 3`` (1-based; for SmolLM2's 30 layers: 2, 15, 27), the layers its reference code reads. Below 8
    layers some coincide or fall out of order (4 layers: 2, 2, 1); the recipe keeps the distinct ones, sorted."""
    low, mid, high = 2, num_layers // 2, num_layers - 3
    return (min(low, num_layers), max(min(mid, num_layers), 1), max(high, 1))


class Eagle3ReleaseHead(nn.Module):
    """The released EAGLE-3 draft head (module docstring).

    Args:
        config: the head's transformers ``LlamaConfig`` (sizes, norm epsilon, RoPE).
        draft_vocab: ``V_d``; taps_width: the fused features' width (``3 H_t``).
        norm_before_residual: the residual around the attention is ``hidden_norm(u)`` instead of ``u`` (a
            ``speculators`` head's ``norm_before_residual``, SpecForge's default).
    """

    def __init__(self, config: Any, draft_vocab: int, taps_width: int, norm_before_residual: bool = False) -> None:
        super().__init__()
        self.norm_before_residual = norm_before_residual  # speculators' flag: the residual is hidden_norm(u)
        from transformers.models.llama.modeling_llama import LlamaRMSNorm, LlamaRotaryEmbedding

        h, heads, kv = config.hidden_size, config.num_attention_heads, config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or h // heads
        self.kv_heads = kv
        eps = config.rms_norm_eps
        self.fuse = nn.Linear(taps_width, h, bias=False)
        self.hidden_norm, self.input_norm = LlamaRMSNorm(h, eps=eps), LlamaRMSNorm(h, eps=eps)
        self.post_norm, self.norm = LlamaRMSNorm(h, eps=eps), LlamaRMSNorm(h, eps=eps)
        self.q_proj = nn.Linear(2 * h, heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(2 * h, kv * self.head_dim, bias=False)
        self.v_proj = nn.Linear(2 * h, kv * self.head_dim, bias=False)
        self.o_proj = nn.Linear(heads * self.head_dim, h, bias=False)
        self.gate_proj = nn.Linear(h, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(h, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, h, bias=False)
        self.lm_head = nn.Linear(h, draft_vocab, bias=False)
        self.rotary = LlamaRotaryEmbedding(config=config)
        self.register_buffer("vocab", torch.arange(draft_vocab))  # target ids: set from d2t by the loader
        self.lean = None

    def forward(
        self,
        embeds: torch.Tensor,
        feats: torch.Tensor,
        positions: torch.Tensor | None = None,
        mask: torch.Tensor | None = None,
        cache: Any = None,
    ) -> torch.Tensor:
        """``embeds [B, N, H]`` (of ``x_{t+1}``), ``feats [B, N, H]`` (``u_t`` or the head's own output) ->
        ``g [B, N, H]``, attending to ``cache`` (a :class:`~decodekit.cache.CacheView` or transformers cache, layer
        0) under ``mask [B, 1, N, S]`` at ``positions [B, N]``; without a cache, causal attention over the ``N``
        positions ``0 ..`` (training), as :class:`~decodekit.drafters.eagle_head.EagleHead` does."""
        batch, num, _ = embeds.shape
        if positions is None:
            positions = torch.arange(num, device=embeds.device)[None].expand(batch, -1)
        both = torch.cat([embeds, feats], -1)
        out = compiled_step(self, self, both, positions, mask, cache)  # dk.generate(compile=True)
        if out is not None:
            return out
        q, k, v = self.project(both, positions)
        keys, values = (k, v) if cache is None else cache.update(k, v, 0)
        return self.finish(both, q, keys, values, mask, causal=cache is None)

    def project(self, both: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Rotated queries ``[B, Hq, N, D]``, keys and values ``[B, Hkv, N, D]`` from ``both = [embeds | feats]``
        ``[B, N, 2H]`` at ``positions [B, N]``."""
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

        batch, num, _ = both.shape
        embeds, feats = both.chunk(2, -1)
        x = torch.cat([self.input_norm(embeds), self.hidden_norm(feats)], -1)
        q, k, v = (p(x).view(batch, num, -1, self.head_dim).transpose(1, 2) for p in (self.q_proj, self.k_proj,
                                                                                       self.v_proj))  # fmt: skip
        cos, sin = self.rotary(x, positions)
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        return q, k, v

    def finish(
        self,
        both: torch.Tensor,
        q: torch.Tensor,
        keys: torch.Tensor,
        values: torch.Tensor,
        mask: torch.Tensor | None,
        causal: bool = False,
    ) -> torch.Tensor:
        """``g [B, N, H]`` after attending ``keys`` / ``values [B, Hkv, S, D]`` under ``mask [B, 1, N, S]`` (or
        causally, ``causal``): the residual (the normed features where ``norm_before_residual``) and the MLP."""
        batch, num, _ = both.shape
        feats = both.chunk(2, -1)[1]
        out = grouped_attention(q, keys, values, mask, self.head_dim**-0.5, causal=causal)
        residual = self.hidden_norm(feats) if self.norm_before_residual else feats
        h = residual + self.o_proj(out.transpose(1, 2).reshape(batch, num, -1))
        y = self.post_norm(h)
        return h + self.down_proj(F.silu(self.gate_proj(y)) * self.up_proj(y))

    def weights(self) -> list[torch.Tensor]:
        """Every tensor the layer reads (what a frozen compiled step is compiled against)."""
        return [*self.parameters(), *self.buffers()]

    def scores(self, g: torch.Tensor) -> torch.Tensor:
        """``g [..., H]`` -> ``[..., V_d]`` float32: the head's own output layer on ``norm(g)``."""
        return self.lm_head(self.norm(g)).float()

    @torch.no_grad()
    def init_from(self, target: LanguageModel) -> None:
        """Start from the target (training): the layer is its last decoder layer reading the feature half of the
        attention input (``hidden_norm`` its input norm; the embedding half small noise), the final norm its
        final norm, ``lm_head`` its output rows for :attr:`vocab`. A target whose layer is not Llama-shaped (other
        sizes or norms) keeps the random start for what does not fit."""
        state = target.layers[-1].state_dict() if getattr(target, "layers", None) is not None else {}  # type: ignore[attr-defined]
        for name in ("q_proj", "k_proj", "v_proj"):
            w = state.get(f"self_attn.{name}.weight")
            proj = getattr(self, name)
            proj.weight.normal_(0, 0.02)
            if w is not None and w.shape == proj.weight[:, w.shape[1] :].shape:
                proj.weight[:, w.shape[1] :] = w
        pairs = {"self_attn.o_proj.weight": self.o_proj, "mlp.gate_proj.weight": self.gate_proj,
                 "mlp.up_proj.weight": self.up_proj, "mlp.down_proj.weight": self.down_proj,
                 "input_layernorm.weight": self.hidden_norm,
                 "post_attention_layernorm.weight": self.post_norm}  # fmt: skip
        for key, module in pairs.items():
            if key in state and state[key].shape == module.weight.shape:
                module.weight.copy_(state[key])
        norm = getattr(target, "_norm", None)
        if norm is not None and norm.weight.shape == self.norm.weight.shape:
            self.norm.weight.copy_(norm.weight)
        self.lm_head.weight.copy_(target.lm_head.weight[self.vocab.to(target.lm_head.weight.device)])  # type: ignore[attr-defined]

    def save(self, path: Any, metadata: dict[str, Any]) -> None:
        """Write the weights (float16) and ``metadata`` as a decodekit head file
        (:func:`~decodekit.drafters.head_files.save_head`)."""
        from decodekit.drafters.head_files import save_head

        save_head(self, path, metadata)

    @torch.no_grad()
    def keep_vocab(self, vocab: torch.Tensor) -> None:
        """Keep the output rows of the token ids ``vocab [V']`` (each one of :attr:`vocab`, in that order)."""
        rows = rows_of(self.vocab, vocab.to(self.vocab.device))
        assert bool((rows >= 0).all()), "keep_vocab: a token the head does not score"
        self.lm_head.weight = nn.Parameter(self.lm_head.weight[rows].clone())
        self.lm_head.out_features = len(rows)
        self.vocab = vocab.to(self.vocab.device).clone()


def rows_of(vocab: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """``[len(ids)]`` long: the index of each token id of ``ids`` in ``vocab [V]`` (distinct ids), ``-1`` where it is
    not there: an output row of a head over ``vocab`` by token id."""
    order = vocab.argsort()
    at = torch.searchsorted(vocab[order], ids).clamp(max=len(vocab) - 1)
    return torch.where(vocab[order][at] == ids, order[at], -1)


class OwnLogits:
    """Draft logits from the head's own output layer, at the target ids its draft vocabulary maps to (``-inf``
    elsewhere: never drafted, ``q = 0``), the interface of :class:`~decodekit.drafters.head_files.TrimmedHead`."""

    def __init__(self, head: Eagle3ReleaseHead, vocab_size: int) -> None:
        self.head, self.vocab_size = head, vocab_size

    def logits(self, g: torch.Tensor) -> torch.Tensor:
        full = torch.full((*g.shape[:-1], self.vocab_size), float("-inf"), device=g.device)
        return full.index_copy_(full.dim() - 1, self.head.vocab, self.head.scores(g))
