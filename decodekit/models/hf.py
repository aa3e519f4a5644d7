"""Adapter for transformers causal LMs (Llama, Qwen2/3, GPT-2, Mistral, ... any model whose attention writes
through the ``Cache.update`` interface and accepts a 4-D mask and ``position_ids``)."""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Sequence
from typing import Any

import torch

from decodekit.cache import CacheView, KVCache
from decodekit.errors import ConfigError, UnsupportedModelError
from decodekit.masks import to_additive
from decodekit.models.attention_scores import RecordsAttention, recorded_attention, restricted_masks
from decodekit.models.base import LanguageModel, ModelOutput, check_layer
from decodekit.models.call_scope import call_scope, captured, run_numbers, selectable, selected_blocks
from decodekit.models.compile_switch import capacity_bucket, compile_scope
from decodekit.models.compiled import StaticForward, eager_reason
from decodekit.models.grouped_attention import TORCH_HAS_GQA, grouped_query_sdpa
from decodekit.models.hf_attention import attention_plan, per_layer_masks
from decodekit.models.hf_support import CHAIN_ONLY, cache_argument, check_supported, logit_multiplier, rope_context
from decodekit.models.lean import lean_decoder

log = logging.getLogger(__name__)

_MASK_KINDS = {"sdpa": "bool", "eager": "additive"}
_LAYER_LISTS = ("layers", "h")  # where decoders keep their blocks (Llama-style, GPT-2-style)
_FINAL_NORMS = ("norm", "ln_f", "final_layernorm")


def _as_tuple(ids: Any) -> tuple[int, ...]:
    if ids is None:
        return ()
    return (ids,) if isinstance(ids, int) else tuple(int(i) for i in ids)


def _decoder(model: torch.nn.Module) -> torch.nn.Module:
    """The decoder stack under the LM head (``get_decoder()``, else the usual attribute names)."""
    from transformers import PreTrainedModel

    decoder = model.get_decoder()
    if decoder is model or not isinstance(decoder, PreTrainedModel):  # ModernBERT's "decoder" is its head
        names = ("model", "transformer", getattr(model, "base_model_prefix", ""))
        decoder = next((m for n in names if n and isinstance(m := getattr(model, n, None), torch.nn.Module)), model)
    return decoder


def _map_masks(masks: Any, fn: Any) -> Any:
    """Apply ``fn`` to a mask, each value of a mapping of masks, or each mask of a list."""
    if isinstance(masks, dict):
        return {k: fn(v) for k, v in masks.items()}
    if isinstance(masks, list):
        return [fn(v) for v in masks]
    return fn(masks)


class HFCausalLM(RecordsAttention, LanguageModel):
    """Wraps a ``transformers`` ``*ForCausalLM`` so decodekit can run it against a :class:`KVCache`.

    The decoder runs with decodekit's boolean mask (sdpa) or its additive form (eager); sliding-window, chunked and
    GPT-Neo local layers get that mask restricted to their pattern (:mod:`decodekit.models.hf_attention`).
    Architectures that cannot be run exactly are refused with :class:`~decodekit.errors.UnsupportedModelError`
    (:mod:`decodekit.models.hf_support`). Logits are computed only at the positions asked for (the output head is
    applied after gathering hidden states).

    What wrapping does to the model you pass (and nothing else): it is put in ``eval()`` mode, and an attention
    implementation other than ``sdpa`` / ``eager`` (flash attention, flex, ...) is switched to ``sdpa`` with a
    warning, because only those two take arbitrary tree masks; and its decoder's layer list becomes a
    :class:`~decodekit.models.call_scope.SelectableModuleList` (the same modules and ``state_dict``). A forward never
    changes the model: an early-exit or layer-skipping forward (``exit_layer=``, ``skip_layers=``) selects its
    blocks, and its hooks act, only within its own call (:mod:`decodekit.models.call_scope`), so calls on the same
    model from several threads, or a forward started inside another, each run the model as it is.

    Llama, Mistral, Qwen2 and Qwen3 decoders with ``sdpa`` attention and no windowed layers run through
    :class:`~decodekit.models.lean.LeanDecoder`: the same blocks and arithmetic (bit-identical outputs) without
    transformers' per-call wrappers; a hook on the decoder, a block or its attention module sends a forward back
    through transformers.

    A model loaded with ``device_map="auto"`` over several devices (accelerate's hooks move each layer's inputs to
    its device) runs as is: :attr:`device` is its input embedding's, and logits and hidden states come back there.

    Args:
        model: a causal LM (``PreTrainedModel`` with an output embedding).
        tokenizer: its tokenizer, if any (used by benchmarks, chat templates and the HF bridge).
    """

    compiles = True  # forward() runs decodekit's compiled step where it applies, else says why not

    def __init__(self, model: torch.nn.Module, tokenizer: Any = None) -> None:
        self.decoder = _decoder(model)
        check_supported(model, self.decoder)
        self._cache_arg = cache_argument(self.decoder)  # "cache", or "past_key_values" before transformers 5.24
        self.tree_refusal = CHAIN_ONLY.get(getattr(model.config, "model_type", ""))
        self.lm_head = model.get_output_embeddings()  # captured: rebuild the adapter after swapping modules
        if self.decoder is model or self.lm_head is None:
            raise UnsupportedModelError(f"{type(model).__name__} is not a causal LM with a separate output head")
        self.attention = attention_plan(model, self.decoder)  # refuses before anything about the model changes
        self.full_attention = self.attention.plain  # no sliding-window or chunked layers
        self.hf = model.eval()
        config = model.config
        attn = getattr(config, "_attn_implementation", "eager")
        if attn not in _MASK_KINDS:
            given, attn = attn, "sdpa" if getattr(model, "_supports_sdpa", True) else "eager"  # eager-only: Gemma 2
            log.warning("attention implementation %r cannot take tree masks; switching the model to %r", given, attn)
            model.set_attn_implementation(attn)
        self._additive_mask = _MASK_KINDS[attn] == "additive"
        self._grouped = not self._additive_mask and TORCH_HAS_GQA  # sdpa: multi-query CPU calls without repeat_kv
        self._layers_attr = next(
            (a for a in _LAYER_LISTS if isinstance(getattr(self.decoder, a, None), torch.nn.ModuleList)), None
        )
        if self._layers_attr is not None:
            selectable(getattr(self.decoder, self._layers_attr))  # per-call exits and skips (module docstring)
        self._norm = next((m for a in _FINAL_NORMS if (m := getattr(self.decoder, a, None)) is not None), None)
        self.softcap = getattr(config, "final_logit_softcapping", None)
        self.logit_multiplier = logit_multiplier(config)  # Cohere's, Granite's, ... scale after the head
        self.vocab_size = int(getattr(self.lm_head, "out_features", None) or config.vocab_size)
        self._embeddings = model.get_input_embeddings()
        self._embed_weight = self._embeddings.weight  # device / dtype (quantized heads have no .weight)
        gen_config = self.generation_config = getattr(model, "generation_config", None)
        source = gen_config if gen_config is not None else config  # model.generate reads its generation config's only
        self.eos_token_ids = _as_tuple(getattr(source, "eos_token_id", None))
        context = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
        self.max_context = context if isinstance(context, int) and context > 0 else None  # XLNet: -1 = unbounded
        if (exact := rope_context(model)) is not None:  # Phi-3's longrope: other rotary factors past it
            warnings.warn(f"{type(model).__name__} switches its rotary factors past {exact} tokens (transformers then "
                          "recomputes the whole cache); decodekit runs it exactly up to there: its context is capped "
                          f"at {exact}", stacklevel=3)  # fmt: skip
            self.max_context = exact
        self.tokenizer = tokenizer
        self._biases: dict[int, Any] = {}  # GPT-Neo's global causal biases, made once
        device_map = getattr(model, "hf_device_map", None) or {}
        self._spread = len(set(map(str, device_map.values()))) > 1  # layers on several devices (device_map)
        leanable = self.attention.per_layer is None and not device_map  # not GPT-Neo's hooks, nor accelerate's
        self._lean = lean_decoder(model, self.decoder) if leanable else None  # no per-call Python
        compiles = self._lean is not None and self._lean.compiles  # StaticForward's stacks
        self._static = StaticForward(self._lean, self.head, self.hf.parameters) if compiles else None

    @property
    def device(self) -> torch.device:
        return self._embed_weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self._embed_weight.dtype

    @property
    def layers(self) -> torch.nn.ModuleList:
        """The decoder's blocks (``decoder.layers`` or ``decoder.h``)."""
        if self._layers_attr is None:
            raise ConfigError(
                f"{type(self.hf).__name__} keeps its decoder blocks in neither of {', '.join(_LAYER_LISTS)}; "
                "early exit and per-layer hidden states need one of them"
            )
        return getattr(self.decoder, self._layers_attr)

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def config(self) -> Any:
        return self.hf.config

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        return self._embeddings(tokens)

    def norm(self, hidden: torch.Tensor) -> torch.Tensor:
        if self._norm is None:
            raise ConfigError(f"{type(self.hf).__name__} has no final norm among {', '.join(_FINAL_NORMS)}")
        return self._norm(hidden)

    def head(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = self.lm_head(hidden)
        if self.logit_multiplier is not None:
            logits = logits * self.logit_multiplier
        if self.softcap:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits.to(self.device) if self._spread else logits

    def forward(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        mask: torch.Tensor,
        view: CacheView,
        logits_at: torch.Tensor | None = None,
        *,
        exit_layer: int | None = None,
        hidden_layers: Sequence[int] = (),
        return_hidden: bool = False,
        skip_layers: Sequence[int] = (),
        attend: torch.Tensor | None = None,
    ) -> ModelOutput:
        if not isinstance(view, CacheView):
            raise TypeError(
                f"{type(self).__name__}.forward takes the CacheView for this forward (view = cache.stage(n), "
                f"cache.write_at(slots) or cache.attend(n)), got {type(view).__name__}"
            )
        attention_mask: Any = mask
        if attend is not None:  # [L, B, Hkv, S0]: each layer's and key/value head's allowed slots
            if not self.attention.plain or exit_layer is not None or skip_layers:
                raise ConfigError("attend= needs every layer to attend alike, and all layers run (no exit or skips)")
            attention_mask = restricted_masks(mask, attend, self.config.num_attention_heads)
        elif not self.attention.plain:
            attention_mask = self.attention.masks(mask, positions, view.key_positions(positions))
        hidden: dict[int, torch.Tensor] = {}
        sink = self._take_sink()
        selected = None  # every block
        if exit_layer is not None or skip_layers:
            selected = selected_blocks(self.layers, exit_layer, skip_layers, hidden_layers, self.attention.plain, self)
        for i in hidden_layers:
            check_layer(i, 0, self.num_layers, "hidden_layers entries must be integers")
        lean = self._lean is not None and not isinstance(attention_mask, list) and self._lean.ready()  # list: attend=
        scope = compile_scope()
        if scope is not None:  # dk.generate(compile=True): a static-shape compiled forward where it applies
            why = eager_reason(self, lean, (attend, sink) != (None, None), bool(skip_layers))
            run = None if selected is None else run_numbers(self.layers, selected)  # an exit's or skips' blocks
            args = (tokens, positions, attention_mask, view, hidden_layers, logits_at is None, scope.mode)
            static = None if why else self._static(*args, scope.canvas, run)
            if why:
                scope.eager(why)
            elif static is not None:  # the compiled step takes the boolean masks (Gemma 2's too)
                return self._output(*static[:2], logits_at, return_hidden, logits=static[2])
        if self._additive_mask:
            attention_mask = _map_masks(attention_mask, lambda m: to_additive(m, self.dtype))
        layer_masks = attention_mask if isinstance(attention_mask, list) else None
        with (
            call_scope(self.layers if self._layers_attr is not None else None, selected) as call,
            grouped_query_sdpa() if self._grouped else contextlib.nullcontext(),
            recorded_attention(sink) if sink is not None else contextlib.nullcontext(),
            contextlib.nullcontext() if lean else captured(self._hooked(hidden_layers), hidden, call),
            self._per_layer(layer_masks),
        ):
            if lean:  # the same arithmetic without transformers' per-call work (decodekit.models.lean)
                last = self._lean(tokens, positions, attention_mask, view, hidden_layers, hidden)
            else:
                last = self.decoder(
                    input_ids=tokens,
                    position_ids=positions,
                    attention_mask=layer_masks[0] if layer_masks else attention_mask,
                    use_cache=True,
                    **{self._cache_arg: view},
                ).last_hidden_state
        return self._output(last, hidden, logits_at, return_hidden)

    def _output(
        self,
        last: torch.Tensor,
        hidden: dict[int, torch.Tensor],
        logits_at: torch.Tensor | None,
        return_hidden: bool,
        logits: torch.Tensor | None = None,
    ) -> ModelOutput:
        """Logits at ``logits_at`` (all positions: None) from the normed output ``last [B, N, H]`` (or ``logits``
        already computed at every position, by a compiled forward)."""
        if logits is None:
            picked = last
            if logits_at is not None:
                picked = last.gather(1, logits_at.to(last.device)[..., None].expand(-1, -1, last.shape[-1]))
            logits = self.head(picked)
        if self._spread:  # the last layers' device: back to the inputs'
            last, hidden = last.to(self.device), {i: h.to(self.device) for i, h in hidden.items()}
        return ModelOutput(logits, hidden, last if return_hidden else None)

    def new_cache(self, batch_size: int, capacity: int) -> KVCache:
        """As :meth:`LanguageModel.new_cache`; under ``compile=True`` the capacity is rounded up to a bucket
        (:func:`~decodekit.models.compile_switch.capacity_bucket`), so compiled forwards see few key lengths."""
        scope = compile_scope()
        if scope is not None and self._static is not None:
            capacity = capacity_bucket(capacity, scope.canvas)
        return super().new_cache(batch_size, capacity)

    def _per_layer(self, masks: list[torch.Tensor] | None) -> contextlib.AbstractContextManager[None]:
        if masks is None:
            return contextlib.nullcontext()
        return per_layer_masks(self.layers, masks, self._biases)

    def _hooked(self, layer_ids: Sequence[int]) -> dict[int, torch.nn.Module]:
        """The modules whose outputs are layers ``layer_ids`` (0 = embeddings)."""
        return {i: self._embeddings if i == 0 else self.layers[i - 1] for i in sorted(set(layer_ids))}

    def __repr__(self) -> str:
        return f"HFCausalLM({type(self.hf).__name__}, vocab={self.vocab_size}, device={self.device})"
