"""Which attention pattern each layer of a transformers model uses, and how decodekit hands it the masks.

decodekit passes its own 4-D masks (trees, ragged rows, diffusion patterns), which transformers uses unchanged, so
every position-dependent restriction a layer adds on top of causality must be built into the mask here:

- sliding-window layers (Mistral v0.1, Mixtral, Starcoder2, Phi-3, Qwen2 with ``use_sliding_window``, Gemma 2/3,
  Cohere2, OLMo 3, gpt-oss, ...): query position ``q`` sees key position ``k`` when ``q - k < window``;
- chunked layers (Llama 4): only keys in the query's chunk;
- GPT-Neo's ``local`` layers: a window, from a causal bias the layer slices assuming the queries are the last keys
  (wrong for ragged rows and trees), so decodekit swaps that bias for the global one during its forwards and puts
  the window in a per-layer mask.

A model whose decoder takes a mapping from layer type to mask (``config.layer_types``) gets one; a model with one
pattern for every layer gets that mask; GPT-Neo gets its per-layer masks through forward pre-hooks.
:func:`attention_plan` also refuses, with :class:`~decodekit.errors.UnsupportedModelError`, what cannot be made
exact (``docs/supported-models.md`` lists both).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from decodekit.errors import UnsupportedModelError
from decodekit.masks import chunked, windowed
from decodekit.models.call_scope import current_call

FULL = "full_attention"
_SLIDING_TYPES = ("sliding_attention", "local")
_CHUNKED_TYPES = ("chunked_attention",)


@dataclass(frozen=True)
class Pattern:
    """One layer's attention pattern: ``kind`` in {"full", "sliding", "chunked"} and its ``size`` (window or
    chunk length; None for full)."""

    kind: str = "full"
    size: int | None = None

    def apply(self, mask: torch.Tensor, positions: torch.Tensor, key_positions: torch.Tensor) -> torch.Tensor:
        if self.kind == "sliding":
            return windowed(mask, positions, key_positions, self.size)  # type: ignore[arg-type]
        if self.kind == "chunked":
            return chunked(mask, positions, key_positions, self.size)  # type: ignore[arg-type]
        return mask


@dataclass(frozen=True)
class AttentionPlan:
    """How the adapter turns its mask into what the decoder takes.

    Attributes:
        single: one pattern for every layer (the decoder takes one mask), or None. All three None (the default):
            plain causal attention everywhere.
        by_type: layer type name -> pattern, for decoders that take a mapping (``config.layer_types``), or None.
        per_layer: one pattern per layer, delivered by forward pre-hooks (GPT-Neo), or None.
    """

    single: Pattern | None = None
    by_type: dict[str, Pattern] | None = None
    per_layer: tuple[Pattern, ...] | None = None

    @functools.cached_property
    def patterns(self) -> frozenset[Pattern]:
        """The distinct patterns of the model's layers (empty for the default plan: plain causal attention)."""
        if self.single is not None:
            return frozenset({self.single})
        return frozenset((self.by_type or {}).values()) | frozenset(self.per_layer or ())

    @functools.cached_property
    def plain(self) -> bool:
        """True when every layer takes decodekit's mask unchanged (no key positions needed)."""
        return self.patterns <= {Pattern()}

    def masks(self, mask: torch.Tensor, positions: torch.Tensor, key_positions: torch.Tensor) -> Any:
        """What the decoder takes as ``attention_mask``, from decodekit's mask ``[B, 1, N, S]`` (bool), the query
        ``positions [B, N]`` and ``key_positions [B, S]``: one tensor, a mapping layer type -> tensor, or (for
        :attr:`per_layer`) a list with one tensor per layer to hand over with :func:`per_layer_masks`."""
        built = {p: p.apply(mask, positions, key_positions) for p in self.patterns}
        if self.single is not None:
            return built[self.single]
        if self.by_type is not None:
            return {name: built[p] for name, p in self.by_type.items()}
        return [built[p] for p in self.per_layer or ()]


def _window(config: Any, architecture: str) -> int:
    window = getattr(config, "sliding_window", None) or getattr(config, "window_size", None)
    if not isinstance(window, int) or window < 1:
        raise UnsupportedModelError(f"{architecture}: sliding-window layers but no usable window size ({window!r})")
    return window


def _pattern(layer_type: str, config: Any, architecture: str) -> Pattern:
    if layer_type in (FULL, "global", "attention"):
        return Pattern()
    if layer_type in _SLIDING_TYPES:
        return Pattern("sliding", _window(config, architecture))
    if layer_type in _CHUNKED_TYPES:
        return Pattern("chunked", int(config.attention_chunk_size))
    why = (
        "sparse indexed attention keeps a key cache of its own"
        if "index" in layer_type
        else "recurrent, convolutional or linear-attention layers keep state outside the KV cache"
    )
    raise UnsupportedModelError(
        f"{architecture}: layer type {layer_type!r} is not attention decodekit can mask ({why}); "
        "see docs/supported-models.md"
    )


def _forward_source(decoder: torch.nn.Module) -> str:
    try:
        return inspect.getsource(type(decoder).forward)
    except (OSError, TypeError):
        return ""


def attention_plan(model: torch.nn.Module, decoder: torch.nn.Module) -> AttentionPlan:
    """Work out each layer's attention pattern and how to deliver it (see the module docstring).

    Raises:
        UnsupportedModelError: layers of a kind decodekit cannot mask, or per-layer patterns the decoder has no
            way to receive.
    """
    config = model.config
    architecture = type(model).__name__
    source = _forward_source(decoder)
    if getattr(config, "model_type", "") == "gpt_neo":
        layers = tuple(_pattern(t, config, architecture) for t in config.attention_layers)
        return AttentionPlan(per_layer=layers)
    layer_types = getattr(config, "layer_types", None)
    if layer_types:
        by_type = {t: _pattern(t, config, architecture) for t in dict.fromkeys(layer_types)}
        if len(set(by_type.values())) == 1:
            return AttentionPlan(single=next(iter(by_type.values())))
        if "attention_mask, dict" not in source:
            raise UnsupportedModelError(
                f"{architecture}: layers of types {sorted(by_type)} need different masks, and its decoder does not "
                "take a mapping from layer type to mask"
            )
        return AttentionPlan(by_type=by_type)
    if getattr(config, "sliding_window", None) and "create_sliding_window_causal_mask" in source:
        return AttentionPlan(single=Pattern("sliding", _window(config, architecture)))
    return AttentionPlan()


_BIAS_LOCK = threading.Lock()
_BIAS_SWAPS: dict[int, tuple[int, torch.Tensor]] = {}  # id(attention) -> (forwards using the swap, its own bias)


@contextlib.contextmanager
def per_layer_masks(layers: torch.nn.ModuleList, masks: list[torch.Tensor], biases: dict[int, Any]) -> Iterator[None]:
    """Hand layer ``i`` the mask ``masks[i]`` (its ``attention_mask`` keyword) during the block, in the running
    forward only (:func:`~decodekit.models.call_scope.current_call`: another thread's forward, or one started inside
    this one, gets its own masks). GPT-Neo's local layers also get the global causal bias (made once, kept in
    ``biases``), since the mask now carries their window: that bias is the model's own state, so it is swapped
    while any decodekit forward on the model needs it (counted over threads) and put back by the last one out."""
    call = current_call()
    handles, swapped = [], []
    for i, mask in enumerate(masks[: len(layers)]):

        def hook(_module: Any, args: Any, kwargs: dict[str, Any], mask: torch.Tensor = mask) -> Any:
            if call is None or call.active:
                return args, {**kwargs, "attention_mask": mask}
            return None

        layer = layers[i]
        handles.append(layer.register_forward_pre_hook(hook, with_kwargs=True))
        attn = getattr(getattr(layer, "attn", None), "attention", None)
        if getattr(attn, "attention_type", None) == "local":
            with _BIAS_LOCK:
                users, local = _BIAS_SWAPS.get(id(attn), (0, attn.bias))
                full = biases.get(id(attn))
                if full is None or full.shape != local.shape or full.device != local.device:
                    full = biases[id(attn)] = torch.tril(torch.ones_like(local))
                _BIAS_SWAPS[id(attn)] = (users + 1, local)
                attn.bias = full
            swapped.append(attn)
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()
        with _BIAS_LOCK:
            for attn in swapped:
                users, local = _BIAS_SWAPS.pop(id(attn))
                if users > 1:
                    _BIAS_SWAPS[id(attn)] = (users - 1, local)
                else:
                    attn.bias = local
