"""The hooks of a call's components: ``begin`` and ``select_rows`` with what each declared it takes
(``needs``); the typo warnings for names one edit away from a hook are :func:`decodekit.interfaces.warn_near_hooks`."""

from __future__ import annotations

from typing import Any

import torch

from decodekit.cache import KVCache
from decodekit.interfaces import Begins, SelectsRows, shares_target
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
