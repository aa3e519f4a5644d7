"""Test helpers shared across files: spies on a diffusion LM's forwards, and a wrapper that delegates to a component."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any


@contextlib.contextmanager
def fed_positions(model: Any, state: Any) -> Iterator[dict[int, list[list[int]]]]:
    """Record, per ``state.step``, the canvas positions each row's forward ran (padding, at position 0, left out)."""
    fed: dict[int, list[list[int]]] = {}
    forward = model.lm.forward

    def spy(tokens, positions, *args, **kwargs):
        fed[state.step] = [sorted(set(row) - {0}) for row in positions.tolist()]
        return forward(tokens, positions, *args, **kwargs)

    model.lm.forward = spy
    try:
        yield fed
    finally:
        model.lm.forward = forward


@contextlib.contextmanager
def forward_widths(model: Any) -> Iterator[list[int]]:
    """Record the width (tokens a row) of every forward the model runs."""
    widths: list[int] = []
    forward = model.lm.forward

    def spy(tokens, *args, **kwargs):
        widths.append(tokens.shape[1])
        return forward(tokens, *args, **kwargs)

    model.lm.forward = spy
    try:
        yield widths
    finally:
        model.lm.forward = forward


class Wrapped:
    """A component around ``inner``: every attribute it does not define is ``inner``'s (its hooks included), so a
    test overrides only what it changes (``propose``, ``draft_kind``, ...)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)
