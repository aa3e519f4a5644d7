"""One call's options, transformers-style, merged and checked: :func:`call_options` (``GenerationConfig`` <
keywords, see :mod:`decodekit.spec.conventions` for what is accepted, ignored and refused), then the values that need
the model or the prompts (processors, ``max_length``, the pad id, the stop strings' tokenizer)."""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from decodekit.checks import (
    check_bool,
    check_callable,
    check_float,
    check_int,
    check_signature,
    describe,
    eos_ids,
    is_int,
)
from decodekit.errors import ConfigError, ConfigTypeError
from decodekit.models import LanguageModel
from decodekit.spec.conventions import REFUSED_PROCESSORS, WARPING, config_fields, refuse_extra


def max_lengths_for(rows: list[list[int]], max_new_tokens: int, model: LanguageModel) -> list[int]:
    """Each row's length limit: its prompt plus ``max_new_tokens``, at most the model's context (with a warning)."""
    limit = model.max_context or max(len(r) for r in rows) + max_new_tokens
    if any(len(r) + max_new_tokens > limit for r in rows):
        warnings.warn(
            f"prompt + max_new_tokens exceeds the model's context ({limit}); rows stop at the context length",
            stacklevel=3,
        )
    return [min(len(r) + max_new_tokens, limit) for r in rows]


def eos_list_for(eos_token_id: int | Sequence[int] | None, model: LanguageModel) -> list[int]:
    """The ids that end a row: ``eos_token_id`` checked, or the model's when None."""
    if eos_token_id is None:
        return list(model.eos_token_ids)
    return eos_ids(eos_token_id, model.vocab_size)


__all__ = [
    "eos_list_for",
    "max_lengths_for",
    "CallOptions",
    "build_processors",
    "call_options",
    "max_new_tokens_for",
    "pad_id",
    "padded_inputs",
    "prompts_or_input_ids",
    "tokenizer_for",
]


@dataclass(frozen=True)
class CallOptions:
    """The transformers-style options of one call, merged (``GenerationConfig`` < keywords) and checked."""

    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None
    max_new_tokens: int | None = None
    max_length: int | None = None
    eos_token_id: Any = None
    pad_token_id: int | None = None
    min_new_tokens: int = 0
    repetition_penalty: float | None = None
    no_repeat_ngram_size: int = 0
    bad_words_ids: list[list[int]] | None = None
    suppress_tokens: list[int] | None = None
    logits_processor: list[Any] = field(default_factory=list)
    stop_strings: tuple[str, ...] = ()


def call_options(generation_config: Any, keywords: dict[str, Any], extra: Mapping[str, Any]) -> CallOptions:
    """Merge ``generation_config``'s set fields with the call's ``keywords`` (None = not given), refuse ``extra``
    (keywords :func:`decodekit.generate` does not take) by name, and check every value."""
    refuse_extra(extra)
    from_config = config_fields(generation_config)
    merged = from_config | {k: v for k, v in keywords.items() if v is not None}
    do_sample = merged.pop("do_sample", None)
    do_sample = None if do_sample is None else check_bool("do_sample", do_sample)
    if do_sample is None and generation_config is not None and all(keywords.get(k) is None for k in WARPING):
        do_sample = False  # the config's own default, as transformers reads it: its temperature alone samples not
        if any(k in from_config for k in WARPING):
            warnings.warn(
                "generation_config sets "
                + ", ".join(f"{k}={from_config[k]!r}" for k in WARPING if k in from_config)
                + " but not do_sample=True: decoding is greedy, as in transformers; set do_sample=True to sample",
                stacklevel=3,
            )
    temperature = check_float("temperature", merged.pop("temperature", None), low=0, optional=True)
    if do_sample is False:
        temperature = 0.0  # transformers ignores temperature / top_k / top_p without sampling
    elif do_sample and temperature == 0:
        raise ConfigError("do_sample=True needs temperature > 0, got 0; use do_sample=False for greedy decoding")
    elif do_sample:
        temperature = 1.0 if temperature is None else temperature
    if not temperature and do_sample is None and any(keywords.get(k) is not None for k in ("top_k", "top_p")):
        warnings.warn(
            "top_k / top_p shape sampling; at temperature 0 (greedy decoding) they change nothing: pass "
            "temperature > 0 (or do_sample=True) to sample",
            stacklevel=3,
        )
    processors = merged.pop("logits_processor", None)
    stop = merged.pop("stop_strings", None)
    return CallOptions(
        temperature=temperature or 0.0,
        top_k=None if do_sample is False or merged.get("top_k") == 0 else merged.get("top_k"),  # 0 = off
        top_p=None if do_sample is False else merged.get("top_p"),
        max_new_tokens=check_int("max_new_tokens", merged.get("max_new_tokens"), low=1, optional=True),
        max_length=check_int("max_length", merged.get("max_length"), low=2, optional=True),
        eos_token_id=merged.get("eos_token_id"),
        pad_token_id=check_int("pad_token_id", merged.get("pad_token_id"), low=0, optional=True),
        min_new_tokens=check_int("min_new_tokens", merged.get("min_new_tokens", 0), low=0),
        repetition_penalty=check_float(
            "repetition_penalty", merged.get("repetition_penalty"), low=0, low_open=True, optional=True
        ),
        no_repeat_ngram_size=check_int("no_repeat_ngram_size", merged.get("no_repeat_ngram_size", 0), low=0),
        bad_words_ids=_id_lists("bad_words_ids", merged.get("bad_words_ids")),
        suppress_tokens=_ids("suppress_tokens", merged.get("suppress_tokens")),
        logits_processor=_processors(processors),
        stop_strings=_strings(stop),
    )


def build_processors(options: CallOptions, vocab_size: int, eos: list[int], device: Any) -> list[Any]:
    """transformers' processors for ``options``, in transformers' order, then the call's ``logits_processor``."""
    from transformers.generation import (
        NoBadWordsLogitsProcessor,
        NoRepeatNGramLogitsProcessor,
        RepetitionPenaltyLogitsProcessor,
        SuppressTokensLogitsProcessor,
    )

    for name in ("bad_words_ids", "suppress_tokens"):
        ids = [t for row in (getattr(options, name) or []) for t in (row if isinstance(row, list) else [row])]
        bad = next((t for t in ids if not 0 <= t < vocab_size), None)
        if bad is not None:
            raise ConfigError(f"{name} holds {bad}, outside the model's vocabulary [0, {vocab_size})")
    out: list[Any] = []
    if options.repetition_penalty is not None and options.repetition_penalty != 1.0:
        out.append(RepetitionPenaltyLogitsProcessor(options.repetition_penalty))
    if options.no_repeat_ngram_size:
        out.append(NoRepeatNGramLogitsProcessor(options.no_repeat_ngram_size))
    if options.bad_words_ids:
        out.append(NoBadWordsLogitsProcessor(options.bad_words_ids, eos_token_id=eos or None))
    if options.suppress_tokens:
        out.append(SuppressTokensLogitsProcessor(options.suppress_tokens, device=device))
    return out + list(options.logits_processor)


def prompts_or_input_ids(prompts: Any, input_ids: Any, attention_mask: Any) -> Any:
    """``prompts``, or transformers' ``input_ids`` (+ ``attention_mask``) keywords as a tokenizer output would be."""
    if input_ids is None:
        if prompts is None:
            raise ConfigTypeError(
                "prompts must be token ids, strings or a tokenizer's output (or pass input_ids=), got None"
            )
        if attention_mask is not None:
            raise ConfigError(
                "attention_mask goes with input_ids=: pass generate(model, input_ids=ids, attention_mask=mask), or "
                "the tokenizer's whole output as prompts"
            )
        return prompts
    if prompts is not None:
        raise ConfigError("pass prompts or input_ids=, not both")
    return (
        {"input_ids": input_ids}
        if attention_mask is None
        else {"input_ids": input_ids, "attention_mask": attention_mask}
    )


def max_new_tokens_for(options: CallOptions, rows: list[list[int]], width: int | None = None) -> int:
    """``max_new_tokens``; else ``max_length`` minus the input's padded ``width`` (a ``[B, T]`` input's ``T``, as
    transformers counts it, so every row gets the same budget; ragged lists: the longest prompt); else 64."""
    if options.max_new_tokens is not None or options.max_length is None:
        return options.max_new_tokens or DEFAULT_MAX_NEW_TOKENS
    longest = width or max(map(len, rows))
    if options.max_length <= longest:
        what = "the padded input" if width else "the longest prompt"
        raise ConfigError(
            f"max_length={options.max_length} leaves no room after {what} ({longest} tokens); "
            "set max_new_tokens instead (it counts per row)"
        )
    return options.max_length - longest


def padded_inputs(source: Any) -> torch.Tensor | None:
    """The call's input as the ``[B, T]`` batch it was given, padding included (a 2-D tensor or array, or a
    tokenizer's output's ``input_ids``), on the CPU: what transformers counts ``max_length`` from and what
    :meth:`~decodekit.types.GenerationOutput.padded` starts with. None for ragged lists, strings or one prompt."""
    ids = source.get("input_ids") if isinstance(source, Mapping) else source
    if isinstance(ids, (str, bytes)) or not hasattr(ids, "__len__") or not len(ids):
        return None
    try:
        batch = torch.as_tensor(ids)
    except (TypeError, ValueError, RuntimeError):  # ragged lists, strings
        return None
    return batch.long().cpu() if batch.dim() == 2 and not batch.is_floating_point() else None


DEFAULT_MAX_NEW_TOKENS = 64


def tokenizer_for(tokenizer: Any, model: LanguageModel) -> Any:
    tokenizer = tokenizer if tokenizer is not None else model.tokenizer
    if tokenizer is None:
        raise ConfigError(
            "stop_strings needs the model's tokenizer: pass tokenizer=..., or load the model with "
            "decodekit.load_model(model, tokenizer=tokenizer)"
        )
    return tokenizer


def pad_id(options: CallOptions, model: LanguageModel, eos: list[int]) -> int | None:
    """The call's ``pad_token_id``, else the model's own ``GenerationConfig``'s, else the tokenizer's, else the first
    EOS id (transformers' fallback)."""
    if options.pad_token_id is not None:
        return options.pad_token_id
    own = getattr(model.generation_config, "pad_token_id", None)
    if is_int(own) and own >= 0:
        return int(own)
    pad = getattr(model.tokenizer, "pad_token_id", None)
    if isinstance(pad, int):
        return pad
    return eos[0] if eos else (model.eos_token_ids[0] if model.eos_token_ids else None)


def _ids(name: str, value: Any) -> list[int] | None:
    if value is None:
        return None
    if not isinstance(value, Sequence) or isinstance(value, str) or not all(is_int(t) for t in value):
        raise ConfigTypeError(f"{name} must be a list of token ids, got {describe(value)}")
    return [int(t) for t in value]


def _id_lists(name: str, value: Any) -> list[list[int]] | None:
    if value is None:
        return None
    ok = isinstance(value, Sequence) and not isinstance(value, str)
    rows = (
        [_ids(name, row) if isinstance(row, Sequence) and not isinstance(row, str) else None for row in value]
        if ok
        else []
    )
    if not ok or not rows or any(not row for row in rows):
        raise ConfigTypeError(f"{name} must be a non-empty list of non-empty token id lists, got {describe(value)}")
    return [_ids(name, row) for row in value]  # type: ignore[misc]


def _processors(value: Any) -> list[Any]:
    if value is None:
        return []
    items = [value] if callable(value) and not isinstance(value, Sequence) else value
    if not isinstance(items, Sequence) or isinstance(items, str):
        raise ConfigTypeError(
            f"logits_processor must be a list of processors f(input_ids, scores), got {describe(value)}"
        )
    for i, item in enumerate(items):
        check_callable(f"logits_processor[{i}]", item, optional=False, expected="a processor f(input_ids, scores)")
        check_signature(f"logits_processor[{i}]", item, 2, "f(input_ids, scores)")
        reason = REFUSED_PROCESSORS.get(type(item).__name__)
        if reason:
            raise ConfigError(f"logits_processor[{i}] is a {type(item).__name__}, which {reason}")
    return list(items)


def _strings(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    strings = [value] if isinstance(value, str) else value
    if not isinstance(strings, Sequence) or not all(isinstance(s, str) and s for s in strings) or not strings:
        raise ConfigTypeError(f"stop_strings must be a non-empty string or a list of them, got {describe(value)}")
    return tuple(strings)
