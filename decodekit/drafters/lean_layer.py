"""A draft head's decoder layer run without transformers' per-call machinery, for the draft steps.

An EAGLE head drafts with one decoder layer of its target's architecture, a handful of one-token forwards a round.
Through transformers each such forward passes the model's wrappers (output capturing, config defaults, mask
preparation, the attention-function registry) before the few small products that are the actual work; on the
2-core CPU that overhead is about a third of a draft step. :class:`LeanLayer` runs the same layer's arithmetic
directly from its modules (norms, rotary embedding, projections), with the query / key / value projections and the
gate / up projections each fused into one product (:func:`~decodekit.kernels.cpu.fused_linear`).

It covers the Llama family (:data:`COVERED`: Llama, Mistral, Qwen2, Qwen3 decoder layers; biases and Qwen3's
per-head query / key norms included) under boolean masks; :func:`lean_layer` returns None for any other layer,
which keeps transformers' path. Outputs equal the transformers path's to float rounding
(``tests/unit/test_lean_layer.py``). Inference only: the fused products are copies of the layer's weights.
"""

from __future__ import annotations

from typing import Any

import torch

from decodekit.cache import CacheView
from decodekit.kernels.cpu import fused_linear
from decodekit.models.grouped_attention import grouped_attention
from decodekit.models.lean import COVERED_LAYERS as COVERED


class LeanLayer:
    """The single decoder layer of ``decoder`` (a transformers ``*Model`` with ``rotary_emb``, ``layers`` and
    ``norm``), then its final norm, as one callable for cached inference. Build it with :func:`lean_layer`.

    ``__call__(x [B, N, H], positions [B, N], mask [B, 1, N, S] bool, cache) -> [B, N, H]``: the same contract as
    the transformers decoder called with ``inputs_embeds=x`` on a staged :class:`~decodekit.cache.CacheView`
    (layer 0)."""

    def __init__(self, decoder: Any) -> None:
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb  # the covered layers' own

        self.rotate = apply_rotary_pos_emb
        layer = decoder.layers[0]
        attn = layer.self_attn
        self.rotary, self.final_norm = decoder.rotary_emb, decoder.norm
        self.in_norm, self.post_norm = layer.input_layernorm, layer.post_attention_layernorm
        self.q_norm, self.k_norm = getattr(attn, "q_norm", None), getattr(attn, "k_norm", None)
        self.head_dim, self.scaling = int(attn.head_dim), float(attn.scaling)
        self.o_proj, self.down, self.act = attn.o_proj, layer.mlp.down_proj, layer.mlp.act_fn
        self.qkv = fused_linear([attn.q_proj, attn.k_proj, attn.v_proj])
        self.split = [attn.q_proj.out_features, attn.k_proj.out_features, attn.v_proj.out_features]
        self.gate_up = fused_linear([layer.mlp.gate_proj, layer.mlp.up_proj])

    def __call__(self, x: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor, cache: CacheView) -> torch.Tensor:
        batch, num, _ = x.shape
        q, k, v = self.qkv(self.in_norm(x)).split(self.split, -1)
        q, k, v = (t.view(batch, num, -1, self.head_dim) for t in (q, k, v))
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        cos, sin = self.rotary(x, positions)
        q, k = self.rotate(q.transpose(1, 2), k.transpose(1, 2), cos, sin)
        keys, values = cache.update(k, v.transpose(1, 2), 0)
        out = grouped_attention(q, keys, values, mask, self.scaling)
        x = x + self.o_proj(out.transpose(1, 2).reshape(batch, num, -1))
        gate, up = self.gate_up(self.post_norm(x)).chunk(2, -1)
        return self.final_norm(x + self.down(self.act(gate) * up))


def lean_layer(decoder: Any) -> LeanLayer | None:
    """A :class:`LeanLayer` for ``decoder``'s single layer, or None when the layer is not one it covers
    (:data:`COVERED`; more than one layer; eager or additive-mask attention), where transformers' path stays."""
    layers = getattr(decoder, "layers", None)
    if layers is None or len(layers) != 1 or not all(hasattr(decoder, name) for name in ("rotary_emb", "norm")):
        return None
    config = getattr(decoder, "config", None)
    if type(layers[0]).__name__ not in COVERED or getattr(config, "_attn_implementation", None) != "sdpa":
        return None
    return LeanLayer(decoder)
