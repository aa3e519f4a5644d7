"""The ``compile=`` switch of a call: its buckets, its scope and its one warning per reason (the compiled forward
itself is :mod:`decodekit.models.compiled`)."""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from contextvars import ContextVar
from typing import Any

import torch

from decodekit.checks import check_choice

__all__ = [
    "CAPACITY_STEP",
    "WIDTHS",
    "CompileScope",
    "capacity_bucket",
    "compile_scope",
    "compiling",
    "resolve_compile",
    "width_bucket",
]

WIDTHS = (1, 2, 4, 8, 16, 32, 64)  # padded query widths; wider forwards (prefills) run eager
CAPACITY_STEP = 256  # cache capacities under compile are multiples of this


def width_bucket(num_new: int) -> int | None:
    """The padded width of a forward over ``num_new`` tokens, or None past the widest bucket (it runs eager)."""
    return next((w for w in WIDTHS if w >= num_new), None)


def capacity_bucket(capacity: int) -> int:
    """A cache capacity for compiled forwards: room for ``capacity`` tokens and a padded draft, rounded up to a
    multiple of :data:`CAPACITY_STEP` (so prompts of other lengths give the same key length)."""
    need = capacity + WIDTHS[-1]
    return -(-need // CAPACITY_STEP) * CAPACITY_STEP


def resolve_compile(value: Any, device: torch.device) -> bool:
    """``generate``'s ``compile=``: True, False, or ``"auto"`` (on for CUDA, where the eager loop is dispatch-bound;
    off on the CPU, where it was measured not to pay)."""
    check_choice("compile", value, (True, False, "auto"))
    if value == "auto":
        return torch.device(device).type == "cuda"
    return bool(value)


class CompileScope:
    """One call's compile switch: the warnings it has given (one per reason)."""

    def __init__(self) -> None:
        self.warned: set[str] = set()

    def eager(self, reason: str) -> None:
        """Say once in this call that forwards run eager, and why."""
        if reason not in self.warned:
            self.warned.add(reason)
            warnings.warn(f"compile=True: {reason}; those forwards run eager", stacklevel=4)


_SCOPE: ContextVar[CompileScope | None] = ContextVar("decodekit_compile", default=None)


def compile_scope() -> CompileScope | None:
    """The running call's :class:`CompileScope` (None: forwards run eager)."""
    return _SCOPE.get()


@contextlib.contextmanager
def compiling(on: bool = True) -> Iterator[CompileScope | None]:
    """Within the block, covered forwards run static and compiled (module docstring); ``on=False`` changes
    nothing."""
    if not on:
        yield None
        return
    scope = CompileScope()
    token = _SCOPE.set(scope)
    try:
        yield scope
    finally:
        _SCOPE.reset(token)
