"""The tokenizer interface benchmark tasks need, over any tokenizer-like object.

Tasks accept a transformers tokenizer, a ``tokenizers.Tokenizer``-style object or any plain callable / object with
``encode``: :func:`encode` turns one text into a flat ``list[int]`` whatever the object returns, and
:func:`apply_chat_template` wraps one user message with the tokenizer's chat template.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from decodekit.errors import ConfigError

__all__ = ["apply_chat_template", "encode", "require_chat_template"]


def encode(tokenizer: Any, text: str, *, special: bool) -> list[int]:
    """Token ids of ``text``; ``special`` = add the tokenizer's special tokens (BOS, ...) where it supports that.

    ``tokenizer`` is called as ``tokenizer(text)`` if it is callable, else ``tokenizer.encode(text)``; the result
    may be a list, a tensor, a mapping or object with ``input_ids``, or a ``tokenizers.Encoding``.

    Raises:
        ConfigError: the tokenizer has neither form, or does not return a flat list of ints.
    """
    if callable(tokenizer):
        try:
            out = tokenizer(text, add_special_tokens=special)
        except TypeError:  # a plain callable without the keyword
            out = tokenizer(text)
    elif callable(getattr(tokenizer, "encode", None)):
        try:
            out = tokenizer.encode(text, add_special_tokens=special)
        except TypeError:
            out = tokenizer.encode(text)
    else:
        raise ConfigError(f"tokenizer {type(tokenizer).__name__} has neither __call__(text) nor encode(text)")
    if isinstance(out, Mapping):
        out = out["input_ids"]
    elif hasattr(out, "input_ids"):
        out = out.input_ids
    elif hasattr(out, "ids"):  # tokenizers.Encoding
        out = out.ids
    if hasattr(out, "tolist"):
        out = out.tolist()
    ids = list(out)
    if ids and not all(isinstance(t, int) for t in ids):
        raise ConfigError(
            f"tokenizer returned {type(ids[0]).__name__} items instead of token ids for one text; "
            "it must map one string to a flat list of ints"
        )
    return ids


def require_chat_template(tokenizer: Any, task: str) -> None:
    """Refuse, before any data is read, a tokenizer that cannot apply a chat template for chat task ``task``.

    Raises:
        ConfigError: no ``apply_chat_template``, or ``chat_template`` is unset (transformers style).
    """
    apply = getattr(tokenizer, "apply_chat_template", None)
    if not callable(apply) or getattr(tokenizer, "chat_template", "") is None:
        raise ConfigError(
            f"task {task!r} is a chat task and needs a tokenizer with a chat template "
            f"(apply_chat_template), but {type(tokenizer).__name__} has none; use an instruct model's tokenizer "
            "or set tokenizer.chat_template"
        )


def apply_chat_template(tokenizer: Any, text: str) -> str:
    """``text`` as one user message through the tokenizer's chat template, with the generation prompt appended.

    Raises:
        ConfigError: the template is unusable or renders an empty string.
    """
    try:
        out = tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True
        )
    except ValueError as e:  # transformers: "Cannot use chat template functions because ... is not set"
        if "chat_template" in str(e) or "chat template" in str(e):
            raise ConfigError(f"the tokenizer has no usable chat template: {e}") from e
        raise
    if not isinstance(out, str) or not out.strip():
        raise ConfigError(f"apply_chat_template(..., tokenize=False) must return a non-empty string, got {out!r}")
    return out
