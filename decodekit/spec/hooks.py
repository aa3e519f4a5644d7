"""The hooks of a call's components: ``begin`` and ``select_rows`` with what each declared it takes
(``needs``), and :func:`check_signatures`, which binds every method the loop will call to the arguments it will pass
when the call starts; the typo warnings for names one edit away from a hook are
:func:`decodekit.interfaces.warn_near_hooks`."""

from __future__ import annotations

import inspect
from typing import Any

import torch

from decodekit.cache import KVCache
from decodekit.errors import ConfigTypeError
from decodekit.interfaces import Begins, Observes, SelectsRows, shares_target
from decodekit.models.base import LanguageModel, ModelOutput
from decodekit.spec.round import needs_of
from decodekit.spec.state import DecodeState


def begin_component(
    component: Any,
    state: DecodeState,
    target: LanguageModel,
    cache: KVCache,
    prefill: ModelOutput | None,
    *,
    drafter: bool = True,
) -> None:
    """Call ``component``'s ``begin`` hook, if it has one: a drafter with ``shares_target`` gets the target and its
    cache, and the prefill's output too where its ``needs`` has ``"prefill"``; anything else gets the state only.
    ``drafter=False`` for verifiers and policies (never given the target)."""
    if drafter and shares_target(component):
        if "prefill" in needs_of(component):
            component.begin(state, target, cache, prefill=prefill)
        else:
            component.begin(state, target, cache)
    elif isinstance(component, Begins):
        component.begin(state)


def select_component_rows(component: SelectsRows, rows: torch.Tensor, host_rows: list[int] | None) -> None:
    """Call ``component.select_rows``, with ``host_rows`` where its ``needs`` has ``"host_rows"``."""
    if host_rows is not None and "host_rows" in needs_of(component):
        component.select_rows(rows, host_rows=host_rows)  # type: ignore[call-arg]
    else:
        component.select_rows(rows)


def check_signatures(component: Any, role: str) -> None:
    """Refuse, when the call starts, a method of ``component`` (its ``role``: drafter, verifier or policy) that cannot
    take the arguments the loop will pass it (a TypeError after the prefill, or when the first row finishes, before)."""
    calls: list[tuple[str, tuple[str, ...], tuple[str, ...]]] = [
        {"drafter": ("propose", ("state", "budget"), ()), "policy": ("plan", ("state",), ())}.get(
            role, ("verify", ("draft", "logits", "sampling", "generator"), ())
        )
    ]
    if role == "drafter" and shares_target(component):
        calls.append(("begin", ("state", "target", "cache"), ("prefill",) if "prefill" in needs_of(component) else ()))
    elif isinstance(component, Begins):
        calls.append(("begin", ("state",), ()))
    if isinstance(component, Observes):
        calls.append(("observe", ("state", "round"), ()))
    if isinstance(component, SelectsRows):
        calls.append(("select_rows", ("rows",), ("host_rows",) if "host_rows" in needs_of(component) else ()))
    for method, args, keywords in calls:
        try:
            signature = inspect.signature(getattr(component, method))
        except (TypeError, ValueError):  # a builtin or C callable: nothing to check
            continue
        try:
            signature.bind(*args, **dict.fromkeys(keywords))
        except TypeError as error:
            shown = ", ".join((*args, *(f"{k}=" for k in keywords)))
            raise ConfigTypeError(
                f"{type(component).__name__}.{method} cannot be called as the loop calls it, {method}({shown}): "
                f"{error}; give it those parameters"
            ) from None
