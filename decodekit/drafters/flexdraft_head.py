"""FlexDraft's trained part (:class:`FlexDraftHead`): copies of the attention projections (and query / key norms) of
a target's last few decoder layers, used only at mask slots, and the mask slots' learned input, so the target itself
drafts a block through mask slots.

A FlexDraft forward runs a block of the pending token and ``block_size - 1`` mask slots through the target's last
``n`` layers. The pending token comes through the target's first ``L - n`` layers as the target runs it; the mask
slots enter at layer ``L - n`` as one learned vector (``mask_embedding``, as FlexDraft's release adds its mask
slots in the final layers only). In the last ``n`` layers a mask slot's query, key, value and output projections
(and Qwen3's query / key norms) are the head's tuned copies; every other weight is the target's, and every other
position (the pending token, the committed context in the cache) keeps the target's projections. So the
autoregressive path is the target's exactly: the pending token's output is the target's own next-token
distribution, and the committed context's keys and values are those the target's cache already holds. A mask slot
attends to the context, the pending token and every mask slot of its block (bidirectional); the pending token
attends causally. Slot ``j``'s output (after the target's final norm and output head) predicts the token after
position ``s + j``, the target's own (shifted) convention.

Covered: the Llama family of decoder layers (:data:`~decodekit.models.lean.COVERED_LAYERS`: Llama, Mistral, Qwen2,
Qwen3, with their biases and Qwen3's query / key norms) whose layers all attend alike (no sliding windows).
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn

from decodekit.checks import check_int
from decodekit.errors import ConfigError
from decodekit.models.grouped_attention import grouped_attention
from decodekit.models.lean import COVERED_LAYERS

__all__ = ["FlexDraftHead", "block_slots_mask"]

_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj")
_NORMS = ("q_norm", "k_norm")  # Qwen3's, tuned with the projections where the layer has them


def _attention(target: Any, index: int) -> Any:
    return target.layers[index].self_attn


class FlexDraftHead(nn.Module):
    """Tuned attention projections (and query / key norms) for the last ``num_layers`` decoder layers of ``target``
    and the mask slots' input to them (module docstring).

    Args:
        target: the target (a :class:`~decodekit.models.hf.HFCausalLM` of a covered architecture).
        num_layers: tuned layers, the last ones (``1 <= n < L``).
        block_size: slots a block, the pending token's included (drafts of up to ``block_size``: the pending
            token's exact next token, then one a mask slot).

    Attributes:
        mask_embedding: ``[H]``, the mask slots' state entering layer ``L - n`` (small noise until trained or set
            by :meth:`init_from`).
    """

    def __init__(self, target: Any, num_layers: int, block_size: int) -> None:
        super().__init__()
        check_target(target, num_layers)
        check_int("block_size", block_size, low=1, hint=" (the mask slots drafted after the pending token)")
        self.first = target.num_layers - int(num_layers)  # layers 1 .. first run frozen everywhere
        self.block_size = int(block_size)
        self.tuned = nn.ModuleList()
        for i in range(self.first, target.num_layers):
            attn = _attention(target, i)
            layer = nn.ModuleDict()
            for name in _PROJECTIONS:
                base = getattr(attn, name)
                layer[name] = nn.Linear(base.in_features, base.out_features, bias=base.bias is not None)
            for name in _NORMS:
                if getattr(attn, name, None) is not None:
                    layer[name] = copy.deepcopy(getattr(attn, name))
            self.tuned.append(layer)
        hidden = _attention(target, self.first).q_proj.in_features
        self.mask_embedding = nn.Parameter(0.02 * torch.randn(hidden))

    @torch.no_grad()
    def init_from(self, target: Any, mask_state: torch.Tensor | None = None) -> None:
        """Start every tuned projection and norm from the target's own (a head that changes nothing yet) and, given
        ``mask_state [H]`` (e.g. the mean state of the data at layer ``L - n``), the mask embedding from it."""
        for j, layer in enumerate(self.tuned):
            attn = _attention(target, self.first + j)
            for name, module in layer.items():
                module.load_state_dict(getattr(attn, name).state_dict())
        if mask_state is not None:
            self.mask_embedding.copy_(mask_state.to(self.mask_embedding))

    def mask_slots(self, batch: int, count: int) -> torch.Tensor:
        """``[batch, count, H]``: the mask slots' state entering layer ``L - n``."""
        return self.mask_embedding.expand(batch, count, -1)

    def forward(
        self,
        target: Any,
        x: torch.Tensor,
        frozen: int,
        positions: torch.Tensor,
        mask: torch.Tensor,
        cache: Any = None,
    ) -> torch.Tensor:
        """The last ``n`` layers over ``x [B, N, H]`` (the states entering layer ``L - n``: the target's at rows
        ``:frozen``, which take the target's projections; :meth:`mask_slots` at the rest, which take the tuned ones) at
        ``positions [B, N]`` -> the normed ``[B, N, H]``.

        With ``cache`` (a :class:`~decodekit.cache.CacheView` staged for the ``N`` rows) each layer writes its keys
        and values there and attends to the slots ``mask [B, 1, N, S]`` allows; without, to the ``N`` rows
        themselves (``mask [B, 1, N, N]``, training)."""
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

        batch, num, _ = x.shape
        cos, sin = target.decoder.rotary_emb(x, positions)

        def project(base: nn.Module, mine: nn.Module, h: torch.Tensor) -> torch.Tensor:
            return torch.cat([base(h[:, :frozen]), mine(h[:, frozen:])], 1)

        for j, tuned in enumerate(self.tuned):
            layer = target.layers[self.first + j]
            attn = layer.self_attn
            h = layer.input_layernorm(x)
            q, k, v = (
                project(getattr(attn, n), tuned[n], h).view(batch, num, -1, attn.head_dim) for n in _PROJECTIONS[:3]
            )
            if getattr(attn, "q_norm", None) is not None:
                q, k = project(attn.q_norm, tuned["q_norm"], q), project(attn.k_norm, tuned["k_norm"], k)
            q, k = apply_rotary_pos_emb(q.transpose(1, 2), k.transpose(1, 2), cos, sin)
            v = v.transpose(1, 2)
            if cache is not None:
                k, v = cache.update(k, v, self.first + j)
            out = grouped_attention(q, k, v, mask, float(attn.scaling)).transpose(1, 2).reshape(batch, num, -1)
            x = x + project(attn.o_proj, tuned["o_proj"], out)
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        return target.norm(x)

    def file_fields(self) -> dict[str, Any]:
        """What a head file records of the architecture (:func:`~decodekit.drafters.flexdraft.load_flexdraft`)."""
        return {
            "architecture": "flexdraft",
            "tuned_layers": len(self.tuned),
            "block_size": self.block_size,
        }

    def save(self, path: Any, metadata: dict[str, Any]) -> None:
        """Write the tuned projections and mask embedding (float16) and ``metadata``."""
        from decodekit.drafters.head_files import save_head

        save_head(self, path, metadata)


def check_target(target: Any, num_layers: int) -> None:
    """Refuse a target FlexDraft cannot run: not a covered transformers decoder, windowed layers, or
    ``num_layers`` outside ``1 .. L - 1``."""
    layers = getattr(target, "layers", None) if hasattr(target, "hf") else None
    if layers is None or not hasattr(getattr(target, "decoder", None), "rotary_emb"):
        raise ConfigError(f"flexdraft runs a transformers Llama-family target's own layers; got {target!r}")
    kinds = {type(layer).__name__ for layer in layers}
    if not kinds <= set(COVERED_LAYERS) or not target.full_attention:
        raise ConfigError(
            f"flexdraft covers {', '.join(sorted(COVERED_LAYERS))} decoder layers that all attend alike; "
            f"{type(target.hf).__name__} has {', '.join(sorted(kinds))}"
            + ("" if target.full_attention else " with sliding-window layers")
        )
    if not 1 <= int(num_layers) < len(layers):
        raise ConfigError(
            f"tuned layers must be 1 .. {len(layers) - 1} for this target's {len(layers)}; got {num_layers}"
        )


def block_slots_mask(lengths: torch.Tensor, size: int, kv_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``mask [B, 1, n, S]`` and ``positions [B, n]`` for a block of ``n = size`` slots staged after each row's
    ``lengths [B]`` cached tokens: every slot sees the cached tokens; slot 0 (the pending token) itself, every
    mask slot the whole block."""
    slots = torch.arange(kv_len, device=lengths.device)[None] - lengths[:, None]  # [B, S]: slot - L_b
    query = torch.arange(size, device=lengths.device)[None, :, None]
    in_block = (slots >= 0) & (slots < size)
    mask = (slots < 0)[:, None] | (in_block[:, None] & ((query > 0) | (slots[:, None] == 0)))
    return mask[:, None], lengths[:, None] + torch.arange(size, device=lengths.device)
