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

from typing import Any, Protocol

import torch

from decodekit.cache import CacheView
from decodekit.kernels.cpu import fused_linear
from decodekit.models.compile_switch import compile_scope
from decodekit.models.grouped_attention import grouped_attention
from decodekit.models.lean import COVERED_LAYERS as COVERED
from decodekit.models.static_call import StaticCall, StaticInputs


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
        self.kv_heads = self.split[1] // self.head_dim
        self.gate_up = fused_linear([layer.mlp.gate_proj, layer.mlp.up_proj])

    def __call__(self, x: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor, cache: CacheView) -> torch.Tensor:
        q, k, v = self.project(x, positions)
        keys, values = cache.update(k, v, 0)
        return self.finish(x, q, keys, values, mask)

    def project(self, x: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The rotated queries ``[B, Hq, N, D]``, keys and values ``[B, Hkv, N, D]`` of ``x [B, N, H]`` at
        ``positions [B, N]``."""
        batch, num, _ = x.shape
        q, k, v = self.qkv(self.in_norm(x)).split(self.split, -1)
        q, k, v = (t.view(batch, num, -1, self.head_dim) for t in (q, k, v))
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        cos, sin = self.rotary(x, positions)
        q, k = self.rotate(q.transpose(1, 2), k.transpose(1, 2), cos, sin)
        return q, k, v.transpose(1, 2)

    def finish(
        self, x: torch.Tensor, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor
    ) -> torch.Tensor:
        """The layer's output after attention of ``q`` over ``keys`` / ``values [B, Hkv, S, D]`` under ``mask [B, 1,
        N, S]``: the residual, the MLP and the final norm -> ``[B, N, H]``."""
        batch, num, _ = x.shape
        out = grouped_attention(q, keys, values, mask, self.scaling)
        x = x + self.o_proj(out.transpose(1, 2).reshape(batch, num, -1))
        gate, up = self.gate_up(self.post_norm(x)).chunk(2, -1)
        return self.final_norm(x + self.down(self.act(gate) * up))

    def weights(self) -> list[torch.Tensor]:
        """Every tensor the layer reads (what a frozen compiled step is compiled against)."""
        modules = (self.rotary, self.final_norm, self.in_norm, self.post_norm, self.q_norm, self.k_norm)
        modules += (self.o_proj, self.down, self.qkv, self.gate_up)
        return [t for m in modules if m is not None for t in (*m.parameters(), *m.buffers())]


class SplitLayer(Protocol):
    """A draft head's one layer in the two halves a compiled step needs around the cache write: :class:`LeanLayer`,
    and the released EAGLE-3 layer (:class:`~decodekit.drafters.eagle3_head.Eagle3ReleaseHead`)."""

    head_dim: int
    kv_heads: int

    def project(self, x: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Queries ``[B, Hq, N, D]``, keys and values ``[B, Hkv, N, D]`` of ``x [B, N, ...]``."""
        ...

    def finish(
        self, x: torch.Tensor, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor
    ) -> torch.Tensor:
        """The output ``[B, N, H]`` after attending ``keys`` / ``values [B, Hkv, S, D]`` under ``mask``."""
        ...

    def weights(self) -> list[torch.Tensor]: ...


class StaticLayer(StaticCall):
    """A draft head layer's steps (:class:`SplitLayer`) at static shapes, compiled under ``compile=True``
    (:mod:`decodekit.models.compiled` describes the scheme: width buckets, the whole buffer as keys, the written
    slots as a tensor, one graph per mode kept across calls)."""

    def __init__(self, layer: SplitLayer) -> None:
        super().__init__(layer.weights, "the draft head's layer")
        self.layer = layer

    def _step(self, inputs: StaticInputs) -> torch.Tensor:
        """The traced step on ``inputs`` (``x [B, W, H]``, ``positions`` and ``slots [B, W]``, ``mask [B, 1, W,
        S_buf]``): writes the K/V at ``slots`` of ``keys[0]`` / ``values[0] [B, Hkv, S_buf, D]``; returns
        ``[B, W, H]``."""
        x, positions, mask, slots, keys, values = inputs
        q, k, v = self.layer.project(x, positions)
        index = slots[:, None, :, None]
        keys[0].scatter_(2, index.expand_as(k), k)
        values[0].scatter_(2, index.expand_as(v), v)
        return self.layer.finish(x, q, keys[0], values[0], mask)

    def __call__(
        self, x: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor, view: CacheView, mode: str
    ) -> torch.Tensor | None:
        """The layer's output ``[B, N, H]`` for ``x [B, N, ...]`` against ``view``, compiled in ``mode``; or None
        where it must run eager (nothing written)."""
        inputs = self.prepare(x, positions, mask, view, (1, self.layer.kv_heads, self.layer.head_dim, x))
        out = None if inputs is None else self.run(inputs, (), mode)
        if out is None:
            return None
        view.written((0,))
        return out[:, : x.shape[1]]


def compiled_step(
    owner: Any, layer: SplitLayer | None, x: torch.Tensor, positions: Any, mask: Any, cache: Any
) -> torch.Tensor | None:
    """Under ``dk.generate(compile=True)``: ``layer``'s draft step on ``x`` against the view ``cache``, compiled
    (:class:`StaticLayer`, kept on ``owner``, the head, as ``_static``); None where it runs eager (no compile scope,
    no cache, a width or view that cannot; a head without a ``layer`` says so once a call)."""
    scope = compile_scope() if cache is not None else None
    if scope is None:
        return None
    if layer is None:
        scope.eager("the draft head's layer is not one decodekit's lean path runs (a Llama-family layer, lean=True)")
        return None
    static = owner.__dict__.get("_static")
    if static is None or static.layer is not layer:
        static = owner.__dict__["_static"] = StaticLayer(layer)
    return static(x, positions, mask, cache, scope.mode)


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
