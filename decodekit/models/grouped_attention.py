"""Grouped-query attention under decodekit's masks without copying the cache's keys and values.

transformers' ``sdpa`` attention serves a grouped-query model (``Hq = g * Hkv`` query heads, ``g > 1``) in one of
three ways: torch's native ``enable_gqa`` when there is no mask, a reshape of the queries when there is one query
(``pack_gqa``), and otherwise ``repeat_kv``, which copies every key/value head ``g`` times, the whole cache, in
every layer. decodekit always passes a mask, so every forward over several positions (a verification, a prefill, a
diffusion step) took the copying path. :func:`grouped_query_sdpa` routes those calls on the CPU to torch's
``scaled_dot_product_attention(..., enable_gqa=True)`` instead: the same arithmetic on the same values (the logits
are bit-identical in ``tests/unit/test_grouped_attention.py``), without the copies.

Measured on SmolLM2-135M (9 query heads, 3 key/value heads) on the 2-core CPU with the onednn kernels of the time
(``MkldnnLinear``), one forward over N positions at a context of 900: N = 2 72.8 -> 62.1 ms, N = 5 79.8 -> 71.2
ms, N = 17 103.7 -> 95.6 ms; at a context of 300, 6-7% for N = 2 and 5. GPUs keep transformers' path: there a
masked ``enable_gqa`` call may fall back to torch's math kernel, which would cost more than the copy (not measured
here).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch

from decodekit.models.attention_scores import wrapped_sdpa

__all__ = ["TORCH_HAS_GQA", "grouped_attention", "grouped_query_sdpa"]

TORCH_HAS_GQA = tuple(int(part) for part in torch.__version__.split(".")[:2]) >= (2, 5)  # enable_gqa came in 2.5
_UNSUPPORTED = ("position_bias", "softcap", "s_aux", "sinks")  # what transformers' sdpa (or a model) adds


def grouped_attention(
    q: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor | None,
    scale: float | None = None,
    causal: bool = False,
) -> torch.Tensor:
    """Attention of ``q [B, H, N, D]`` over grouped-query ``keys`` / ``values [B, H_kv, S, D]`` under ``mask`` (or,
    with ``causal`` and no mask, causally): torch's ``enable_gqa`` on the CPU (where this torch has it), the keys and
    values repeated per group elsewhere (on a GPU a masked ``enable_gqa`` call may take the math kernel) ->
    ``[B, H, N, D]``."""
    if keys.shape[1] != q.shape[1] and not (TORCH_HAS_GQA and q.device.type == "cpu"):
        group = q.shape[1] // keys.shape[1]
        keys, values = keys.repeat_interleave(group, 1), values.repeat_interleave(group, 1)
    gqa = {"enable_gqa": True} if keys.shape[1] != q.shape[1] else {}
    return torch.nn.functional.scaled_dot_product_attention(
        q, keys, values, attn_mask=mask, is_causal=causal and mask is None, scale=scale, **gqa
    )


def _takes_over(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: Any, kwargs: dict) -> bool:
    """Whether the call is a masked multi-query CPU call of a grouped-query layer that torch can run natively."""
    return (
        query.device.type == "cpu"
        and query.shape[2] > 1
        and mask is not None
        and query.shape[1] != key.shape[1]
        and key.shape[-1] == value.shape[-1]
        and not kwargs.get("output_attentions", False)
        and all(kwargs.get(name) is None for name in _UNSUPPORTED)
    )


def grouped_query_sdpa() -> contextlib.AbstractContextManager[None]:
    """During the block, transformers' ``sdpa`` attention runs masked multi-query CPU calls of grouped-query layers
    with torch's ``enable_gqa`` (module docstring); every other call goes to transformers' function unchanged.

    Tensors: ``query [B, Hq, Q, D]``, ``key`` / ``value [B, Hkv, S, D]``, ``mask [B, 1 | Hq, Q, S]`` (boolean, True
    attends, or additive); returns ``[B, Q, Hq, D]`` as transformers' function does. Only the running forward's
    calls are routed (:func:`~decodekit.models.attention_scores.wrapped_sdpa`)."""

    def grouping(original: Callable[..., Any]) -> Callable[..., Any]:
        def grouped(
            module: Any,
            query: torch.Tensor,
            key: torch.Tensor,
            value: torch.Tensor,
            attention_mask: Any,
            dropout: float = 0.0,
            scaling: float | None = None,
            **kwargs: Any,
        ) -> tuple[torch.Tensor, None]:
            if not _takes_over(query, key, value, attention_mask, kwargs):
                return original(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
            out = torch.nn.functional.scaled_dot_product_attention(
                query, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling, enable_gqa=True
            )
            return out.transpose(1, 2).contiguous(), None

        return grouped

    return wrapped_sdpa(grouping)
