"""Per-call model state that never touches the shared model.

One adapter forward may run the decoder differently from a plain one: only its first ``L`` blocks (early exit), some
blocks skipped (SWIFT), hooks that record per-layer outputs or hand each layer its own mask. All of that lives in the
calling thread's context (:mod:`contextvars`), never in the model: the decoder's layer list is never swapped, and a
hook a forward registers acts only for that forward. So another forward on the same model in the meantime -- a
plain call on another thread while an early-exit call drafts, or a forward started from inside a layer of another
one -- runs the model as it is.

The one change made to the model, once, when an adapter wraps it: its layer list's class becomes
:class:`SelectableModuleList` (a ``torch.nn.ModuleList`` whose slicing and iteration return the running call's
selected blocks while that call runs, and behave as before otherwise; same modules, same ``state_dict``).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Sequence
from contextvars import ContextVar
from typing import Any, TypeVar

import torch

from decodekit.errors import ConfigError
from decodekit.models.base import check_layer

__all__ = [
    "Call",
    "SelectableModuleList",
    "call_scope",
    "captured",
    "current_call",
    "selectable",
    "selected_blocks",
    "setting",
]

T = TypeVar("T")


@contextlib.contextmanager
def setting(var: ContextVar[T | None], value: T) -> Iterator[T]:
    """``var`` holds ``value`` within the block (in this thread's context), as before it after."""
    token = var.set(value)
    try:
        yield value
    finally:
        var.reset(token)


class Call:
    """One adapter forward: ``layers`` (the decoder's layer list) runs only ``selected`` (None: all of them), and
    transformers' ``sdpa`` attention calls made by it go to ``sdpa`` (None: transformers' own function; see
    :func:`~decodekit.models.attention_scores.wrapped_sdpa`)."""

    __slots__ = ("layers", "sdpa", "selected")

    def __init__(self, layers: torch.nn.ModuleList | None, selected: tuple[torch.nn.Module, ...] | None) -> None:
        self.layers, self.selected = layers, selected
        self.sdpa: Any = None

    @property
    def active(self) -> bool:
        """Whether this call is the one running now in this thread (hooks it registered act only then)."""
        return _CALL.get() is self


_CALL: ContextVar[Call | None] = ContextVar("decodekit_model_call", default=None)


def current_call() -> Call | None:
    """The adapter forward running now in this thread, if any."""
    return _CALL.get()


@contextlib.contextmanager
def call_scope(
    layers: torch.nn.ModuleList | None = None, selected: tuple[torch.nn.Module, ...] | None = None
) -> Iterator[Call]:
    """Run the block as one forward of its own: ``layers`` yields only ``selected`` (None: all), and any
    enclosing forward's selection and hooks do not apply inside it."""
    with setting(_CALL, Call(layers, selected)) as call:
        yield call


class _Selectable:
    """Slicing and iteration give the running call's selected blocks (see the module docstring)."""

    def _selected(self) -> tuple[torch.nn.Module, ...] | None:
        call = _CALL.get()
        return call.selected if call is not None and call.layers is self else None

    def __getitem__(self, idx: Any) -> Any:
        if isinstance(idx, slice):
            selected = self._selected()
            if selected is not None:
                return torch.nn.ModuleList(selected[idx])
        return super().__getitem__(idx)  # type: ignore[misc]

    def __iter__(self) -> Iterator[torch.nn.Module]:
        selected = self._selected()
        return iter(selected) if selected is not None else super().__iter__()  # type: ignore[misc]


class SelectableModuleList(_Selectable, torch.nn.ModuleList):
    """A ``torch.nn.ModuleList`` that a running adapter forward can narrow for itself (module docstring)."""


_CLASSES: dict[type, type] = {torch.nn.ModuleList: SelectableModuleList}
_LOCK = threading.Lock()


def selectable(layers: torch.nn.ModuleList) -> torch.nn.ModuleList:
    """Make ``layers`` selectable per call (in place, once: its class gains :class:`_Selectable`); returns it."""
    if isinstance(layers, _Selectable):
        return layers
    with _LOCK:
        if not isinstance(layers, _Selectable):
            cls = type(layers)
            if cls not in _CLASSES:
                _CLASSES[cls] = type(f"Selectable{cls.__name__}", (_Selectable, cls), {"__module__": __name__})
            layers.__class__ = _CLASSES[cls]
    return layers


def selected_blocks(
    layers: torch.nn.ModuleList,
    exit_layer: int | None,
    skip_layers: Sequence[int],
    hidden_layers: Sequence[int],
    plain: bool,
    model: Any,
) -> tuple[torch.nn.Module, ...]:
    """The blocks of ``layers`` a forward of ``model`` runs: the first ``exit_layer`` (None: all), less
    ``skip_layers`` (1-based). Each keeps its own cache slot (transformers indexes the cache by the block's
    ``layer_idx``); the layer list is left as it is, the forward's own :func:`call_scope` selects these.

    Raises:
        ConfigError: a layer out of range, skips on a model whose layers attend differently (``plain`` False:
            sliding-window or chunked layers), or ``hidden_layers`` the forward does not run.
    """
    last = len(layers) if exit_layer is None else exit_layer
    check_layer(last, 1, len(layers), "exit_layer must be an integer")
    for i in skip_layers:
        check_layer(i, 1, len(layers), "skip_layers entries must be integers")
    if skip_layers and not plain:
        raise ConfigError(
            f"skip_layers needs every layer to attend the same way; {model!r} has sliding-window or chunked layers"
        )
    skipped = set(skip_layers)
    not_run = sorted({i for i in hidden_layers if isinstance(i, int) and (i > last or i in skipped)})
    if not_run:
        raise ConfigError(
            f"hidden_layers {not_run} are not run by this forward (exit_layer={exit_layer}, "
            f"skip_layers={sorted(skipped)}); ask only for layers it runs"
        )
    selectable(layers)  # a layer list put on the decoder after the adapter was made
    return tuple(layers[i - 1] for i in range(1, last + 1) if i not in skipped)  # indexing: never a selection


def run_numbers(layers: Sequence[torch.nn.Module], selected: Sequence[torch.nn.Module]) -> tuple[int, ...]:
    """The 1-based numbers of the ``selected`` blocks among ``layers`` (what a compiled forward runs)."""
    chosen = {id(block) for block in selected}
    return tuple(number for number, block in enumerate(layers, start=1) if id(block) in chosen)


@contextlib.contextmanager
def captured(modules: dict[int, torch.nn.Module], into: dict[int, torch.Tensor], call: Call) -> Iterator[None]:
    """Record the output of each of ``modules`` (layer number -> module) into ``into`` under its number during the
    block, from this ``call`` only (the hooks do nothing for another forward of the model in the meantime)."""
    handles = []
    for i, module in modules.items():

        def hook(_module: Any, _args: Any, output: Any, i: int = i) -> None:
            if call.active:
                into[i] = output[0] if isinstance(output, tuple) else output

        handles.append(module.register_forward_hook(hook))
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()
