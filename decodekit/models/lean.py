"""A lean decoder forward for the Llama family and Gemma 2 / 3: transformers' arithmetic without its per-call Python.

A transformers decoder forward spends most of a small model's time outside the arithmetic: per call it builds mask and
output-capturing machinery, runs keyword-argument decorators and config lookups, and per layer dispatches through three
module wrappers. For the families whose block is exactly ``x + attn(norm(x))`` then ``x + mlp(norm(x))`` with rotary
positions (Llama, Mistral, Qwen2, Qwen3), and Gemma's (norms after attention and around the MLP, scaled embeddings;
Gemma 2's attention logit softcap through its own eager attention; Gemma 3's per-head query / key norms and local and
global rotary tables), :class:`LeanDecoder` runs the same blocks as a plain loop over the model's own modules: its
embedding, norms, projections, MLPs and rotary module are called as they are (so LoRA layers, quantized linears and
hooks on them still act), attention goes through transformers' own ``sdpa`` entry (so decodekit's grouped-query and
attention-recording wrappers still apply), and every operation is the one transformers runs, in the same order. The
logits are bit-identical to transformers' forward (``tests/unit/test_lean_forward.py`` checks every family on prefills,
trees, ragged rows, early exits and hidden states, and with sliding-window layers: Mistral's, Qwen2's and Gemma's, their
masks one per layer type).

Measured on a 2-layer, 64-wide Llama (2-core CPU, one thread): a decode forward 2.7 -> 1.7 ms, a whole greedy token 3.2
-> 2.1 ms. On SmolLM2-135M the arithmetic dominates and the saving is ~1-2 ms of a ~150 ms step. On 3-layer, 64-wide
Gemma 2 / 3 and sliding-window Mistral / Qwen2 models (2026-12-06, one thread, two runs): a greedy token 1.1-1.5x
faster.

Where it does not apply, the adapter calls the decoder as before: other families, ``eager`` attention (but Gemma 2's),
chunked layers, a model spread over devices or wrapped by accelerate, gradient checkpointing while training, and any
forward hook (or replaced ``forward``) on the decoder, a block or its attention module, or a global module hook. The
compiled step (:class:`~decodekit.models.compiled.StaticForward`) runs the same blocks (:meth:`LeanDecoder.block`)
with its own cache writes and attention, for every covered family (:attr:`LeanDecoder.compiles`).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["COVERED_LAYERS", "FAMILIES", "Family", "LeanDecoder", "attention_inputs", "lean_decoder"]


@dataclass(frozen=True)
class Family:
    """A covered family: its decoder, block and attention classes' names and how its block differs from Llama's.

    Attributes:
        qk_norm: the attention normalises queries and keys per head (Qwen3's, Gemma 3's ``q_norm`` / ``k_norm``).
        sandwich: Gemma's block, ``x + post_attn_norm(attn(norm(x)))`` then ``x + post_ffn_norm(mlp(pre_ffn_norm(x)))``.
        typed_rope: one rotary table per layer type (Gemma 3's local and global frequencies).
        softcap: attention through the family's own eager function with its logit softcap (Gemma 2's; that
            family runs ``eager`` attention under additive masks, the others ``sdpa``).
    """

    decoder: str
    layer: str
    attention: str
    qk_norm: bool = False
    sandwich: bool = False
    typed_rope: bool = False
    softcap: bool = False

    @property
    def llama_shaped(self) -> bool:
        """Llama's block exactly (what the feature heads copy and run)."""
        return not (self.sandwich or self.typed_rope or self.softcap)


def _llama_like(prefix: str, qk_norm: bool = False) -> Family:
    return Family(f"{prefix}Model", f"{prefix}DecoderLayer", f"{prefix}Attention", qk_norm)


FAMILIES = {  # model_type -> its family
    "llama": _llama_like("Llama"),
    "mistral": _llama_like("Mistral"),
    "qwen2": _llama_like("Qwen2"),
    "qwen3": _llama_like("Qwen3", qk_norm=True),
    "gemma2": Family("Gemma2Model", "Gemma2DecoderLayer", "Gemma2Attention", sandwich=True, softcap=True),
    "gemma3_text": Family("Gemma3TextModel", "Gemma3DecoderLayer", "Gemma3Attention", True, True, True),
}
COVERED_LAYERS = tuple(f.layer for f in FAMILIES.values() if f.llama_shaped)  # also the EAGLE heads' LeanLayer
_ATTENTION_TYPES = {"full_attention", "sliding_attention"}  # per-type masks come from the adapter


def _replaced(module: torch.nn.Module) -> bool:
    """Whether ``module`` has hooks or an instance-level ``forward`` (accelerate's, a user's patch)."""
    return bool(
        module._forward_hooks
        or module._forward_pre_hooks
        or module._backward_hooks
        or module._backward_pre_hooks
        or "forward" in module.__dict__
    )


def attention_inputs(
    attn: torch.nn.Module, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, qk_norm: bool, rotate: Any
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A covered attention module's rotated queries ``[B, Hq, N, D]`` and keys / values ``[B, Hkv, N, D]`` for its
    normed input ``h [B, N, H]`` (transformers' operations in its order; Qwen3's per-head norms with ``qk_norm``)."""
    head_shape = (*h.shape[:-1], -1, attn.head_dim)
    q, k = attn.q_proj(h).view(head_shape), attn.k_proj(h).view(head_shape)
    if qk_norm:
        q, k = attn.q_norm(q), attn.k_norm(k)
    q, k = q.transpose(1, 2), k.transpose(1, 2)
    v = attn.v_proj(h).view(head_shape).transpose(1, 2)
    q, k = rotate(q, k, cos, sin)
    return q, k, v


def lean_decoder(model: torch.nn.Module, decoder: torch.nn.Module) -> LeanDecoder | None:
    """A :class:`LeanDecoder` for ``decoder`` (``model``'s decoder stack), or None when it is not exactly one of the
    families' own classes, runs attention other than ``sdpa``, or has layers of another attention type (full and
    sliding-window layers are covered: their masks come from the adapter, one per layer type)."""
    config = model.config
    family = FAMILIES.get(getattr(config, "model_type", ""))
    layers = getattr(decoder, "layers", None)
    if family is None or not isinstance(layers, torch.nn.ModuleList) or len(layers) == 0:
        return None
    attention = "eager" if family.softcap else "sdpa"
    if getattr(config, "_attn_implementation", None) != attention or type(decoder).__name__ != family.decoder:
        return None
    types = tuple(getattr(config, "layer_types", None) or ())
    if not set(types) <= _ATTENTION_TYPES or (types and len(types) < len(layers)):
        return None
    for layer in layers:
        attn = getattr(layer, "self_attn", None)
        if type(layer).__name__ != family.layer or type(attn).__name__ != family.attention:
            return None
    if not all(hasattr(decoder, a) for a in ("embed_tokens", "rotary_emb", "norm")):
        return None
    return LeanDecoder(decoder, family, types)


class LeanDecoder:
    """Runs a covered decoder stack (module docstring) against decodekit's cache and mask.

    Args:
        decoder: the ``*Model`` under the LM head (its ``layers`` may be a decodekit selectable list).
        family: how its blocks are built (:class:`Family`).
        layer_types: ``config.layer_types`` (one per layer; empty: every layer full attention).
    """

    def __init__(self, decoder: torch.nn.Module, family: Family, layer_types: Sequence[str] = ()) -> None:
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb  # the covered families' own

        self.decoder, self.family, self.rotate = decoder, family, apply_rotary_pos_emb
        self.qk_norm, self.layer_types = family.qk_norm, tuple(layer_types)

    @property
    def compiles(self) -> bool:
        """Whether :class:`~decodekit.models.compiled.StaticForward` runs this stack: each layer with full or
        sliding-window attention (one mask per layer type)."""
        return set(self.layer_types) <= _ATTENTION_TYPES

    def ready(self) -> bool:
        """Whether this forward may run lean: nothing hooks into (or replaces) the modules it bypasses, and no
        gradient checkpointing is due (a cheap check, made per forward)."""
        from torch.nn.modules import module as nn_module

        if nn_module._global_forward_hooks or nn_module._global_forward_pre_hooks:
            return False
        decoder = self.decoder
        if _replaced(decoder) or (decoder.training and getattr(decoder, "gradient_checkpointing", False)):
            return False
        return not any(_replaced(layer) or _replaced(layer.self_attn) for layer in decoder.layers._modules.values())

    def rope(self, x: torch.Tensor, positions: torch.Tensor) -> dict[str | None, tuple[torch.Tensor, torch.Tensor]]:
        """The rotary tables ``(cos, sin)`` of a forward at ``positions [B, N]``, per layer type (Gemma 3's local and
        global frequencies; one entry, ``None``, for the other families), computed once a forward as transformers
        does."""
        rotary = self.decoder.rotary_emb
        if self.family.typed_rope:
            return {t: rotary(x, positions, t) for t in dict.fromkeys(self.layer_types)}
        return {None: rotary(x, position_ids=positions)}

    def softcapped_attention(self) -> Any:
        """Gemma 2's attention function (its module's ``eager_attention_forward``: ``(module, q, k, v, additive
        mask, dropout=, scaling=, softcap=) -> ([B, N, Hq, D], weights)``, key / value heads repeated inside)."""
        return sys.modules[type(self.decoder.layers[0].self_attn).__module__].eager_attention_forward

    def block(self, layer: torch.nn.Module, x: torch.Tensor, rope: dict[str | None, Any], attend: Any) -> torch.Tensor:
        """Block ``layer`` on its input ``x [B, N, H]``, the family's arithmetic in transformers' order:
        ``attend(attn, q, k, v, kind) -> [B, N, Hq * D]`` writes the keys / values ``[B, Hkv, N, D]`` and attends
        (``kind``: the layer's type, None without ``layer_types``); the eager forward and the compiled step
        (:class:`~decodekit.models.compiled.StaticForward`) each pass their own."""
        attn = layer.self_attn
        kind = self.layer_types[attn.layer_idx] if self.layer_types else None
        cos, sin = rope[kind if self.family.typed_rope else None]
        q, k, v = attention_inputs(attn, layer.input_layernorm(x), cos, sin, self.qk_norm, self.rotate)
        out = attn.o_proj(attend(attn, q, k, v, kind))
        if self.family.sandwich:
            x = x + layer.post_attention_layernorm(out)
            return x + layer.post_feedforward_layernorm(layer.mlp(layer.pre_feedforward_layernorm(x)))
        x = x + out
        return x + layer.mlp(layer.post_attention_layernorm(x))

    def __call__(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        mask: Any,
        cache: Any,
        hidden_layers: Sequence[int] = (),
        into: dict[int, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """The decoder's output (after its final norm).

        Args:
            tokens: ``[B, N]`` token ids; positions: ``[B, N]`` their positions.
            mask: the attention mask as transformers' ``sdpa`` entry takes it (``[B, 1 | Hq, N, S]``), or a mapping
                layer type -> such a mask (sliding-window layers beside full ones).
            cache: the forward's :class:`~decodekit.cache.CacheView` (its ``update`` is called per block, by
                ``layer_idx``).
            hidden_layers: outputs to record into ``into`` (0 = the embeddings, ``i`` = block ``i``'s output).

        Returns:
            ``[B, N, hidden]``. Under a decodekit call scope only the call's selected blocks run.
        """
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

        decoder = self.decoder
        layers = decoder.layers
        want = {id(layers[i - 1]): i for i in hidden_layers if i > 0}  # indexing: never a call's selection
        x = decoder.embed_tokens(tokens)
        if into is not None and 0 in hidden_layers:
            into[0] = x
        rope, family = self.rope(x, positions), self.family
        attention = ALL_ATTENTION_FUNCTIONS["sdpa"]  # read per forward: decodekit's wrappers replace it
        if family.softcap:  # Gemma 2: the family's own eager attention, its logits softcapped
            attention = self.softcapped_attention()
        shape = (*tokens.shape, -1)

        def attend(attn: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kind: str | None) -> torch.Tensor:
            k, v = cache.update(k, v, attn.layer_idx)
            dropout = attn.attention_dropout if attn.training else 0.0
            layer_mask = mask[kind] if isinstance(mask, dict) else mask  # a mapping: one mask per layer type
            softcap = {"softcap": attn.attn_logit_softcapping} if family.softcap else {}
            out, _ = attention(attn, q, k, v, layer_mask, dropout=dropout, scaling=attn.scaling, **softcap)
            return out.reshape(shape).contiguous()

        for layer in layers:  # iteration: the running call's selection
            x = self.block(layer, x, rope, attend)
            if into is not None and id(layer) in want:
                into[want[id(layer)]] = x
        return decoder.norm(x)
