"""Streaming through the bridge, and the ``generate()`` arguments transformers does not pass to a callable
``custom_generate`` (``streamer``, ``assistant_model``), read from the calling frame on verified releases only."""

from __future__ import annotations

import functools
import inspect
import re
import sys
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

import transformers
from transformers.generation.utils import GenerationMixin

from decodekit.checks import check_signature, describe
from decodekit.errors import ConfigError, ConfigTypeError
from decodekit.spec.outputs import StreamerAdapter

__all__ = [
    "VERIFIED_TRANSFORMERS",
    "StreamerAdapter",
    "check_streamer",
    "dropped_generate_arguments",
    "verified_transformers",
]

_PACKAGE = "decodekit.hf"  # frames of the bridge's own modules are not the caller

VERIFIED_TRANSFORMERS = ((5, 20), (6, 0))
"""``[lowest, first unverified)`` transformers ``(major, minor)`` releases whose ``generate`` was checked to keep the
``streamer`` and ``assistant_model`` it drops in its own frame (see :func:`dropped_generate_arguments`)."""


def check_streamer(streamer: Any) -> None:
    """Refuse a streamer that is not a transformers streamer instance (``put(tokens)`` and ``end()`` methods whose
    signatures take those calls)."""
    if streamer is None:
        return
    if isinstance(streamer, type):
        raise ConfigTypeError(
            f"streamer must be an instance, got the class {streamer.__name__}; pass an instance, e.g. "
            f"{streamer.__name__}(tokenizer)"
        )
    if not all(callable(getattr(streamer, name, None)) for name in ("put", "end")):
        raise ConfigTypeError(
            "streamer must be a transformers streamer (put(tokens) and end() methods, e.g. TextStreamer), got "
            f"{describe(streamer)}"
        )
    check_signature("streamer.put", streamer.put, 1, "put(tokens)")
    check_signature("streamer.end", streamer.end, 0, "end()")


# ------------------------------------------------------------------------ arguments transformers drops
def verified_transformers(version: str) -> bool:
    """Whether transformers ``version`` is in :data:`VERIFIED_TRANSFORMERS`."""
    match = re.match(r"(\d+)\.(\d+)", version)
    low, high = VERIFIED_TRANSFORMERS
    return match is not None and low <= (int(match[1]), int(match[2])) < high


def _calling_frames(max_depth: int = 16) -> Iterator[FrameType]:
    """The frames that called the bridge, innermost first (the frames of ``decodekit.hf`` itself skipped)."""
    frame: FrameType | None = sys._getframe()
    for _ in range(max_depth):
        if frame is None:
            return
        module = frame.f_globals.get("__name__", "")
        if module != _PACKAGE and not module.startswith(_PACKAGE + "."):
            yield frame
        frame = frame.f_back


def _unwrap_partial(fn: Any) -> Any:
    while isinstance(fn, functools.partial):
        fn = fn.func
    return fn


def dropped_generate_arguments(bridge: Callable[..., Any]) -> tuple[Any, Any]:
    """``(streamer, assistant_model)`` of the ``generate()`` call that dispatched to ``bridge`` (the bridge's
    ``custom_generate``); ``(None, None)`` when it was not called from ``generate``.

    They are read from the ``GenerationMixin.generate`` frame only on the releases in :data:`VERIFIED_TRANSFORMERS`.
    A streamer seen anywhere else (another release, a ``generate`` other than transformers' own) is refused, since
    the bridge cannot know that transformers expects it to feed that streamer.

    Raises:
        ConfigError: ``generate()`` was given a streamer the bridge cannot honour here.
    """
    generate_code = inspect.unwrap(GenerationMixin.generate).__code__
    for frame in _calling_frames():
        verified = frame.f_code is generate_code and verified_transformers(transformers.__version__)
        if not verified and _unwrap_partial(frame.f_locals.get("custom_generate")) is not bridge:
            continue  # not the generate() call that dispatched to the bridge
        streamer, assistant_model = frame.f_locals.get("streamer"), frame.f_locals.get("assistant_model")
        if streamer is not None and not verified:
            streamer.end()  # transformers has put the prompt into it; release a consumer waiting for the end
            raise ConfigError(
                f"generate() was given streamer={type(streamer).__name__}, which transformers "
                f"{transformers.__version__} does not pass on to custom_generate, and the decodekit bridge reads it "
                "from generate() only on transformers >=5.20,<6 (where that was verified); stream with "
                "decodekit.generate(model, prompts, ..., streamer=fn) instead, or install transformers>=5.20,<6"
            )
        return streamer, assistant_model
    return None, None
