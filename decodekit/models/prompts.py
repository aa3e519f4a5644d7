"""Prompt normalisation for both wings (:func:`decodekit.generate`, :func:`decodekit.dlm.generate`) and the
bridge: every form a researcher passes (token-id lists, tensors, numpy arrays, strings, a tokenizer's output)
becomes a list of token-id lists, or a clear error naming the prompt and what is allowed (see
:mod:`decodekit.checks`)."""

from __future__ import annotations

import numbers
from collections.abc import Iterable, Mapping
from itertools import chain
from typing import TYPE_CHECKING, Any

import torch

from decodekit.checks import describe, int_array, is_int, is_numpy_array
from decodekit.errors import ConfigError, ConfigTypeError, ContextLengthError, EmptyPromptError

if TYPE_CHECKING:
    from decodekit.models.base import LanguageModel

__all__ = ["pad_rows", "prompt_ids"]

_PROMPT_FORMS = (
    "a list of token ids (one prompt), a list of such lists (a batch), a 1-D or 2-D integer tensor or numpy array, "
    "a string or a list of strings (with a tokenizer), or a tokenizer's output (a dict with 'input_ids')"
)


def prompt_ids(prompts: Any, model: LanguageModel) -> list[list[int]]:
    """Normalise ``prompts`` to a non-empty list of non-empty token-id lists that fit the model's context.

    Accepted: ``list[int]`` (one prompt), ``list[list[int]]`` (a ragged batch), a 1-D (one prompt) or 2-D
    (``[batch, length]``) integer tensor or numpy array, strings (encoded with ``model.tokenizer``), and a
    tokenizer's output (``BatchEncoding`` or a dict with ``input_ids``; with an ``attention_mask``, each row's
    padding, left or right, is stripped). Token ids must be integers (floats are refused, never truncated) in
    ``[0, vocab_size)``.

    Raises:
        ConfigTypeError: a form or a token of the wrong type.
        EmptyPromptError: no prompts, or an empty one.
        ConfigError: ids outside the vocabulary, an attention mask that does not fit.
        ContextLengthError: a prompt that leaves no room in the model's context.
    """
    if isinstance(prompts, Mapping):
        rows = _encoded_rows(prompts, model.tokenizer)
    else:
        rows = _rows(prompts, "prompts", model.tokenizer)
    if not rows:
        raise EmptyPromptError("no prompts given; pass at least one prompt")
    vocab, context = model.vocab_size, model.max_context
    lengths = list(map(len, rows))
    flat = list(chain.from_iterable(rows))
    if min(lengths) > 0 and min(flat) >= 0 and max(flat) < vocab and (context is None or max(lengths) < context):
        return rows  # all good, checked at C speed; otherwise the loop below names the first bad prompt
    for i, ids in enumerate(rows):
        if not ids:
            raise EmptyPromptError(f"prompt {i} is empty; every prompt needs at least one token (e.g. BOS)")
        low, high = min(ids), max(ids)
        if low < 0 or high >= vocab:
            bad = low if low < 0 else high
            raise ConfigError(
                f"prompt {i} has token ids outside the vocabulary [0, {vocab}): {bad}; prompts must be ids of the "
                "model's tokenizer"
            )
        if context is not None and len(ids) >= context:
            raise ContextLengthError(
                f"prompt {i} has {len(ids)} tokens but the model's context is {context}; "
                f"shorten it to at most {context - 1} tokens"
            )
    return rows


def pad_rows(rows: list[list[int]], width: int, fill: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """``rows`` (non-empty token-id lists, each at most ``width`` long) right-padded with ``fill``: ``tokens [B,
    width]`` and ``lengths [B]``, on the CPU. One copy of all the ids, not a tensor per row (a 50k-row batch is
    padded in milliseconds)."""
    lengths = torch.tensor([len(r) for r in rows], dtype=torch.long)
    tokens = torch.full((len(rows), width), fill, dtype=torch.long)
    tokens[torch.arange(width) < lengths[:, None]] = torch.tensor(list(chain.from_iterable(rows)), dtype=torch.long)
    return tokens, lengths


def _array_rows(array: Any, name: str, allow_bool: bool = False) -> list[list[int]]:
    """A 1-D (one row) or 2-D integer tensor / numpy array as rows of ints."""
    if not int_array(array, allow_bool):
        raise ConfigTypeError(f"{name}: token ids must be integers, got {describe(array)}")
    if array.ndim == 1:
        return [array.tolist()]
    if array.ndim == 2:
        return array.tolist()
    raise ConfigError(
        f"{name} must be 1-D (one prompt) or 2-D [batch, length], got {describe(array)}; "
        f"{'index it or pass it as a list' if array.ndim == 0 else 'reshape it to [batch, length]'}"
    )


def _rows(value: Any, name: str, tokenizer: Any, allow_bool: bool = False) -> list[list[int]]:
    """``value`` (any accepted prompt form but a mapping) as rows of token ids, types checked."""
    if isinstance(value, torch.Tensor) or is_numpy_array(value):
        return _array_rows(value, name, allow_bool)
    if isinstance(value, str):
        return [_encode(value, tokenizer, name)]
    if value is None or isinstance(value, (bytes, bytearray, Mapping)) or not isinstance(value, Iterable):
        raise ConfigTypeError(f"{name} must be {_PROMPT_FORMS}; got {describe(value)}")
    items = list(value)
    if all(_is_token(t) for t in items):  # one prompt (or an empty batch)
        return [_token_ids(items, name, allow_bool)] if items else []
    if all(type(item) is list for item in items) and set(map(type, chain.from_iterable(items))) <= {int}:
        return [list(item) for item in items]  # the common batch, checked at C speed
    rows = []
    for i, item in enumerate(items):
        where = f"{name}[{i}]"
        if isinstance(item, str):
            rows.append(_encode(item, tokenizer, where))
        elif isinstance(item, torch.Tensor) or is_numpy_array(item):
            if item.ndim != 1:
                raise ConfigError(f"{where} must be a 1-D sequence of token ids, got {describe(item)}")
            rows.extend(_array_rows(item, where, allow_bool))
        elif isinstance(item, Iterable) and not isinstance(item, (bytes, bytearray, Mapping)):
            rows.append(_token_ids(list(item), where, allow_bool))
        else:
            raise ConfigTypeError(
                f"{name} mixes token ids and prompts: {where} is {describe(item)} but other entries are sequences; "
                "pass one prompt as a list of ids or a batch as a list of such lists"
            )
    return rows


def _is_token(value: Any) -> bool:
    """A scalar: a token id, or something that was meant as one (a float, a bool, a 0-d tensor; refused later)."""
    return isinstance(value, numbers.Real) or (isinstance(value, torch.Tensor) and value.ndim == 0)


def _token_ids(items: list[Any], name: str, allow_bool: bool = False) -> list[int]:
    """``items`` as a flat list of ints, refusing floats (never truncated), bools and nested lists."""
    if all(type(t) is int for t in items):  # the common case, checked at C speed
        return list(items)
    ids = []
    for j, token in enumerate(items):
        scalar = isinstance(token, torch.Tensor) and token.ndim == 0 and int_array(token)
        if is_int(token) or scalar or (allow_bool and isinstance(token, bool)):
            ids.append(int(token))
        elif isinstance(token, Iterable) and not isinstance(token, (str, bytes)):
            raise ConfigTypeError(
                f"{name} must be a flat sequence of token ids, but item {j} is {describe(token)}: prompts nest at "
                "most 2 levels (a batch of prompts of ids)"
            )
        else:
            raise ConfigTypeError(
                f"{name}: token ids must be integers, got {describe(token)} at position {j} "
                "(floats are not truncated: convert your ids with int or .long())"
            )
    return ids


def _encode(text: str, tokenizer: Any, name: str) -> list[int]:
    if tokenizer is None:
        raise ConfigError(
            f"{name} is a string, and string prompts need a model with a tokenizer; pass token ids instead, or "
            "load_model(model, tokenizer=...)"
        )
    encoded = tokenizer(text)
    ids = encoded["input_ids"] if isinstance(encoded, Mapping) else encoded
    return _rows(ids, f"{name} (encoded)", None)[0]


def _encoded_rows(encoded: Mapping, tokenizer: Any) -> list[list[int]]:
    """A tokenizer's output: ``input_ids``, with each row's padding (left or right) removed by ``attention_mask``."""
    if "input_ids" not in encoded:
        keys = ", ".join(repr(k) for k in list(encoded)[:8])
        raise ConfigError(
            f"prompts is a mapping without 'input_ids' (keys: {keys or 'none'}); pass a tokenizer's output or token ids"
        )
    rows = _rows(encoded["input_ids"], "prompts['input_ids']", tokenizer)
    mask = encoded.get("attention_mask")
    if mask is None:
        return rows
    masks = _rows(mask, "prompts['attention_mask']", None, allow_bool=True)
    if [len(m) for m in masks] != [len(r) for r in rows]:
        raise ConfigError(
            "prompts['attention_mask'] must have the shape of prompts['input_ids'], got rows of lengths "
            f"{[len(m) for m in masks]} for ids of lengths {[len(r) for r in rows]}"
        )
    out = []
    for i, (ids, row_mask) in enumerate(zip(rows, masks)):
        if any(m not in (0, 1) for m in row_mask):
            raise ConfigError(f"prompts['attention_mask'] must hold 0 (padding) and 1 (token) only; row {i} does not")
        real = [j for j, m in enumerate(row_mask) if m]
        if real and real[-1] - real[0] + 1 != len(real):
            raise ConfigError(
                f"prompts['attention_mask'] row {i} has padding between tokens; only left or right padding can be "
                "removed (each row: padding, tokens, padding)"
            )
        out.append(ids[real[0] : real[-1] + 1] if real else [])
    return out
