"""Name -> class for every component. ``decodekit.build`` and Hydra's ``_target_`` resolve the same classes.

Register a class with the decorator::

    @register("drafter", "ngram")
    class NGramDrafter: ...

and build it by name: ``dk.build("drafter", "ngram", max_ngram=3)``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from decodekit.errors import UnknownComponentError

KINDS = ("drafter", "verifier", "policy")
_REGISTRY: dict[str, dict[str, type]] = {kind: {} for kind in KINDS}

T = TypeVar("T", bound=type)


def register(kind: str, name: str) -> Callable[[T], T]:
    """Class decorator: make ``cls`` buildable as ``build(kind, name, ...)``."""
    _kind(kind)

    def decorator(cls: T) -> T:
        existing = _REGISTRY[kind].get(name)
        same = existing is not None and (existing.__module__, existing.__qualname__) == (
            cls.__module__,
            cls.__qualname__,
        )
        if existing is not None and not same:  # re-registering the same class (module reload) is fine
            raise ValueError(f"{kind} name {name!r} is already taken by {existing.__qualname__}")
        _REGISTRY[kind][name] = cls
        return cls

    return decorator


def resolve(kind: str, name: str) -> type:
    """The class registered as ``name`` under ``kind``."""
    try:
        return _kind(kind)[name]
    except KeyError:
        known = ", ".join(sorted(_REGISTRY[kind])) or "none registered"
        raise UnknownComponentError(f"unknown {kind} {name!r}; available: {known}") from None


def available(kind: str) -> list[str]:
    """Registered names of ``kind``."""
    return sorted(_kind(kind))


def _kind(kind: str) -> dict[str, type]:
    if kind not in _REGISTRY:
        raise UnknownComponentError(f"unknown component kind {kind!r}; expected one of {', '.join(KINDS)}")
    return _REGISTRY[kind]


def build(kind: str, name: str, /, *args: Any, **kwargs: Any) -> Any:
    """Instantiate the component registered as ``name`` under ``kind`` with the given arguments."""
    return resolve(kind, name)(*args, **kwargs)
