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
from decodekit.models.call_scope import setting

__all__ = [
    "CAPACITY_STEP",
    "CHOICES",
    "MODES",
    "WIDE_STEP",
    "WIDTHS",
    "CompileScope",
    "capacity_bucket",
    "compile_scope",
    "compiling",
    "resolve_compile",
    "width_bucket",
]

CHOICES = (True, False, "auto", "max-autotune")  # what a call's (or a bench method's) compile= may be
MODES = ("default", "max-autotune")  # what a call's compile= resolves to (None: eager)
WIDTHS = (1, 2, 4, 8, 16, 32, 64)  # padded query widths; wider forwards (prefills) run eager
CAPACITY_STEP = 256  # cache capacities under compile are multiples of this
WIDE_STEP = 32  # canvas-wide forwards (dk.dlm.generate) past the widest bucket are padded to multiples of this


def width_bucket(num_new: int, canvas: bool = False) -> int | None:
    """The padded width of a forward over ``num_new`` tokens, or None past the widest bucket (it runs eager);
    ``canvas`` (a diffusion LM's canvas-wide forwards): past it, the next multiple of :data:`WIDE_STEP`."""
    if canvas and num_new > WIDTHS[-1]:
        return _round_up(num_new, WIDE_STEP)
    return next((w for w in WIDTHS if w >= num_new), None)


def capacity_bucket(capacity: int, canvas: bool = False) -> int:
    """A cache capacity for compiled forwards: room for ``capacity`` tokens and a padded draft, rounded up to a
    multiple of :data:`CAPACITY_STEP` (so prompts of other lengths give the same key length); ``canvas`` (a
    diffusion LM's cache, made for one canvas of ``capacity`` slots and read whole by every forward): ``capacity``
    rounded up to a multiple of :data:`WIDE_STEP` only, so attention reads few slots past the canvas."""
    if canvas:
        return _round_up(capacity, WIDE_STEP)
    return _round_up(capacity + WIDTHS[-1], CAPACITY_STEP)


def _round_up(n: int, step: int) -> int:
    return -(-n // step) * step


def resolve_compile(value: Any, device: torch.device) -> str | None:
    """``generate``'s ``compile=`` as the mode its forwards run in: None (eager), ``"default"`` or
    ``"max-autotune"``.

    Args:
        value: True (``"default"``: inductor's default kernels; CUDA graphs on CUDA), False, ``"auto"`` (``"default"``
            on CUDA, where the eager loop is dispatch-bound; eager on the CPU, where a compile of minutes does not
            pay back in one call) or ``"max-autotune"`` (weights frozen into the compiled step and the linear layers
            run as inductor's tuned GEMM templates: on the CPU its C++ micro-GEMMs, on CUDA torch's max-autotune
            with CUDA graphs; the first compile takes minutes, cached on disk for later processes).
    """
    check_choice("compile", value, CHOICES)
    if value == "auto":
        return "default" if torch.device(device).type == "cuda" else None
    if value == "max-autotune":
        return value
    return "default" if value else None


class CompileScope:
    """One call's compile switch: its mode (one of :data:`MODES`), whether it is a diffusion LM's call (``canvas``:
    forwards into an empty cache and widths past :data:`WIDTHS` compile too, padded by :func:`width_bucket`) and the
    warnings it has given (one per reason)."""

    def __init__(self, mode: str = "default", canvas: bool = False) -> None:
        check_choice("mode", mode, MODES)
        self.mode, self.canvas = mode, canvas
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
def compiling(mode: str | None = "default", canvas: bool = False, model: Any = None) -> Iterator[CompileScope | None]:
    """Within the block, covered forwards run static and compiled in ``mode`` (one of :data:`MODES`, as
    :func:`resolve_compile` gives it; ``canvas``: a diffusion LM's call, :class:`CompileScope`); None changes
    nothing. ``model``: the call's target, whose forward must read the switch
    (:attr:`~decodekit.models.base.LanguageModel.compiles`), else the call says once that it runs eager."""
    if mode is None:
        yield None
        return
    with setting(_SCOPE, CompileScope(mode, canvas)) as scope:
        if model is not None and not model.compiles:
            scope.eager(f"{type(model).__name__}'s forward does not read compile= (only transformers models compile)")
        yield scope
