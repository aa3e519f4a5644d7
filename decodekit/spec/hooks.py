"""The hooks of a call's components: ``begin`` with what each declared it takes, and typo warnings for names one
edit away from a hook."""

from __future__ import annotations

import warnings
from typing import Any

import torch

from decodekit.cache import KVCache
from decodekit.interfaces import Begins, SelectsRows
from decodekit.models.base import LanguageModel, ModelOutput
from decodekit.spec.round import needs_of
from decodekit.spec.state import DecodeState

_WARNED: set[tuple[type, str]] = set()


def warn_near_hooks(component: object, hooks: tuple[str, ...]) -> None:
    """Warn (once per class and name) about public names one edit away from a hook (of ``hooks``, the names the
    loop looks for on a component of this role) that the component lacks."""
    cls = type(component)
    names = {n for n in dir(cls) if not n.startswith("_")} | {
        n for n in getattr(component, "__dict__", {}) if not n.startswith("_")
    }
    for name in sorted(names - set(hooks)):
        for hook in hooks:
            if hook not in names and _one_edit(name, hook) and (cls, name) not in _WARNED:
                _WARNED.add((cls, name))
                warnings.warn(
                    f"{cls.__name__}.{name} looks like the hook {hook!r}, which {cls.__name__} does not define; "
                    f"decodekit will not call it. Rename it to {hook!r} if that was meant.",
                    stacklevel=4,
                )


def _one_edit(a: str, b: str) -> bool:
    """True when ``a`` becomes ``b`` by one insertion, deletion, substitution or swap of adjacent letters."""
    if a == b or abs(len(a) - len(b)) > 1:
        return False
    if len(a) == len(b):
        diff = [i for i, (x, y) in enumerate(zip(a, b)) if x != y]
        return len(diff) == 1 or (
            len(diff) == 2 and diff[1] == diff[0] + 1 and a[diff[0]] == b[diff[1]] and a[diff[1]] == b[diff[0]]
        )
    short, long = (a, b) if len(a) < len(b) else (b, a)
    i = next((i for i, (x, y) in enumerate(zip(short, long)) if x != y), len(short))
    return short[i:] == long[i + 1 :]


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
    if drafter and getattr(component, "shares_target", False):
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
