"""Spies on a diffusion LM's forwards, shared by the DLM cache tests."""

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
