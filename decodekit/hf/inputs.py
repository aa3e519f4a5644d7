"""The model inputs ``generate()`` prepared, checked against what decodekit's loop can take (left-padded token ids)."""

from __future__ import annotations

from typing import Any

import torch

from decodekit.errors import ConfigError
from decodekit.models import LanguageModel

__all__ = ["check_model_kwargs", "check_no_padding_needed", "check_positions", "real_token_mask"]

_CACHE_KWARGS = ("cache", "past_key_values")  # the cache's name from transformers 5.24 on, and before
_MODEL_KWARGS_HANDLED = {"attention_mask", "position_ids", *_CACHE_KWARGS, "use_cache", "logits_to_keep"}


def check_model_kwargs(model_kwargs: dict[str, Any]) -> None:
    """Refuse model inputs other than the mask / positions / empty cache that decodekit derives itself."""
    extra = sorted(k for k, v in model_kwargs.items() if k not in _MODEL_KWARGS_HANDLED and v is not None)
    if extra:
        raise ConfigError(
            f"the decodekit bridge feeds the model input_ids only and cannot pass {', '.join(extra)}; remove "
            f"{'it' if len(extra) == 1 else 'them'} from the generate() call"
        )
    for name in _CACHE_KWARGS:
        cache = model_kwargs.get(name)
        if cache is not None and hasattr(cache, "get_seq_length") and cache.get_seq_length() > 0:
            raise ConfigError(
                f"the decodekit bridge cannot continue from a filled {name} (decodekit keeps its own cache); "
                f"pass the full prompt in input_ids without {name}"
            )


def real_token_mask(input_ids: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """``[B, T]`` bool mask of real tokens; refuses anything but left padding."""
    if mask is None:
        return torch.ones(input_ids.shape, dtype=torch.bool)
    if mask.shape != input_ids.shape:
        raise ConfigError(
            f"attention_mask must have the shape of input_ids {tuple(input_ids.shape)}, got {tuple(mask.shape)}"
        )
    mask = mask.detach().cpu()
    if not bool(((mask == 0) | (mask == 1)).all()):
        raise ConfigError("attention_mask must hold 0 (padding) and 1 (token) only")
    mask = mask.bool()
    if not bool((mask[:, 1:] >= mask[:, :-1]).all()):
        raise ConfigError(
            "the decodekit bridge needs left padding (each row: padding, then its tokens, no gaps); "
            "tokenize with padding_side='left'"
        )
    return mask


def check_positions(mask: torch.Tensor, position_ids: torch.Tensor | None) -> None:
    """decodekit numbers each row's tokens 0, 1, ... after its padding, as transformers does from the mask."""
    if position_ids is None:
        return
    expected = mask.long().cumsum(-1) - 1
    given = position_ids.detach().cpu().expand(mask.shape)
    if not bool((given == expected)[mask].all()):
        raise ConfigError(
            "the decodekit bridge numbers positions 0, 1, ... from each row's first real token; "
            "remove position_ids from the generate() call"
        )


def check_no_padding_needed(
    target: LanguageModel, prompts: list[list[int]], max_new_tokens: int, eos: tuple[int, ...]
) -> None:
    """Without a pad token every row must generate the same number of tokens (no EOS, no context cap)."""
    limit = target.max_context
    if eos or (limit is not None and any(len(p) + max_new_tokens > limit for p in prompts)):
        raise ConfigError(
            "rows may end at different lengths but there is no pad_token_id to fill them; pass pad_token_id=..."
        )
