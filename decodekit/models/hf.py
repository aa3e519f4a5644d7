"""Adapter for transformers causal LMs (Llama, Qwen2/3, GPT-2, Mistral, ... any model whose attention writes
through the ``Cache.update`` interface and accepts a 4-D mask and ``position_ids``)."""

from __future__ import annotations

import logging
from typing import Any

import torch

from decodekit.cache import KVCache
from decodekit.masks import to_additive
from decodekit.models.base import LanguageModel

log = logging.getLogger(__name__)

_MASK_KINDS = {"sdpa": "bool", "eager": "additive"}


def _as_tuple(ids: Any) -> tuple[int, ...]:
    if ids is None:
        return ()
    if isinstance(ids, int):
        return (ids,)
    return tuple(int(i) for i in ids)


class HFCausalLM(LanguageModel):
    """Wraps a ``transformers`` ``*ForCausalLM`` so decodekit can run it against a :class:`KVCache`.

    The decoder runs with decodekit's boolean mask (sdpa) or its additive form (eager); other attention
    implementations cannot take arbitrary tree masks, so the model is switched to sdpa. Logits are computed
    only at the positions asked for (the output head is applied after gathering hidden states).

    Args:
        model: a causal LM (``PreTrainedModel`` with an output embedding).
        tokenizer: its tokenizer, if any (used by benchmarks, chat templates and the HF bridge).
    """

    def __init__(self, model: torch.nn.Module, tokenizer: Any = None) -> None:
        self.hf = model.eval()
        config = model.config
        attn = getattr(config, "_attn_implementation", "eager")
        if attn not in _MASK_KINDS:
            log.warning("attention implementation %r cannot take tree masks; switching to 'sdpa'", attn)
            model.set_attn_implementation("sdpa")
            attn = "sdpa"
        self._additive_mask = _MASK_KINDS[attn] == "additive"
        self.decoder = model.get_decoder()
        self.lm_head = model.get_output_embeddings()  # captured: rebuild the adapter after swapping modules
        if self.decoder is model or self.lm_head is None:
            raise TypeError(f"{type(model).__name__} is not a causal LM with a separate output head")
        self.softcap = getattr(config, "final_logit_softcapping", None)
        self.vocab_size = int(getattr(self.lm_head, "out_features", None) or config.vocab_size)
        self._embeddings = model.get_input_embeddings().weight  # device / dtype (quantized heads have no .weight)
        gen_config = getattr(model, "generation_config", None)
        self.eos_token_ids = _as_tuple(getattr(gen_config, "eos_token_id", None) or config.eos_token_id)
        self.max_context = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
        self.tokenizer = tokenizer

    @property
    def device(self) -> torch.device:
        return self._embeddings.device

    @property
    def dtype(self) -> torch.dtype:
        return self._embeddings.dtype

    def forward(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        mask: torch.Tensor,
        cache: KVCache,
        logits_at: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if self._additive_mask:
            mask = to_additive(mask, self.dtype)
        out = self.decoder(
            input_ids=tokens, position_ids=positions, attention_mask=mask, past_key_values=cache, use_cache=True
        )
        hidden = out.last_hidden_state
        if logits_at is not None:
            hidden = hidden.gather(1, logits_at[..., None].expand(-1, -1, hidden.shape[-1]))
        logits = self.lm_head(hidden)
        if self.softcap:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits

    def __repr__(self) -> str:
        return f"HFCausalLM({type(self.hf).__name__}, vocab={self.vocab_size}, device={self.device})"
