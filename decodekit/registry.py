"""Name -> class for every component. ``decodekit.build`` and Hydra's ``_target_`` resolve the same classes.

Register a class with the decorator::

    @register("drafter", "ngram")
    class NGramDrafter: ...

and build it by name: ``dk.build("drafter", "ngram", max_ngram=3)``. The recipe of a component in
``decodekit/recipes/<kind>/`` has the same name (``drafter=ngram`` on the command line).

A preset is a registered name for another class with other defaults (``gammatune_plus`` is ``GammaTune`` with its
confidence gate on): :func:`preset` registers it, and what it builds is that class.

A registered class that does not define ``__repr__`` prints readably (:func:`readable_repr`), e.g.
``NGramDrafter(max_ngram=3, min_ngram=1, match='recent')``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, TypeVar

from decodekit.checks import did_you_mean
from decodekit.errors import ConfigTypeError, UnknownComponentError

KINDS = ("drafter", "verifier", "policy", "dlm_rule", "dlm_cache", "dlm_schedule", "dlm_draft")
_REGISTRY: dict[str, dict[str, type]] = {kind: {} for kind in KINDS}

T = TypeVar("T", bound=type)


def register(kind: str, name: str) -> Callable[[T], T]:
    """Class decorator: make ``cls`` buildable as ``build(kind, name, ...)``; a class without its own
    ``__repr__`` gets :func:`readable_repr`."""
    _kind(kind)
    if not isinstance(name, str) or not name:
        raise ConfigTypeError(f"register({kind!r}, name): name must be a non-empty string, got {name!r}")

    def decorator(cls: T) -> T:
        if not callable(cls):
            raise ConfigTypeError(
                f"register({kind!r}, {name!r}) decorates a class (or a factory) that builds the component, got {cls!r}"
            )
        existing = _REGISTRY[kind].get(name)
        same = existing is not None and (existing.__module__, existing.__qualname__) == (
            cls.__module__,
            cls.__qualname__,
        )
        if existing is not None and not same:  # re-registering the same class (module reload) is fine
            raise ValueError(f"{kind} name {name!r} is already taken by {existing.__qualname__}")
        _REGISTRY[kind][name] = cls
        if cls.__repr__ is object.__repr__:
            cls.__repr__ = readable_repr  # type: ignore[assignment]
        return cls

    return decorator


class Preset:
    """A component class with other defaults, registered under a name of its own (:func:`preset`). Calling it builds
    ``builds`` with the preset's settings, each still overridable by keyword or position; its signature is the
    class's with those defaults, so ``inspect.signature``, Hydra's ``_target_`` and the recipes' checks see them."""

    def __init__(self, builds: type, qualname: str, module: str, doc: str, settings: dict[str, Any]) -> None:
        signature = inspect.signature(builds)
        unknown = set(settings) - set(signature.parameters)
        if unknown:
            raise TypeError(f"preset {qualname}: {builds.__qualname__} has no parameter {', '.join(sorted(unknown))}")
        self.builds, self.settings = builds, settings
        self.__name__ = self.__qualname__ = qualname
        self.__module__, self.__doc__ = module, doc
        self.__signature__ = signature.replace(
            parameters=[p.replace(default=settings.get(p.name, p.default)) for p in signature.parameters.values()],
            return_annotation=builds,
        )

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        bound = self.__signature__.bind(*args, **kwargs)
        bound.apply_defaults()
        return self.builds(*bound.args, **bound.kwargs)

    def matches(self, component: Any) -> bool:
        """Whether ``component`` is a ``builds`` holding this preset's settings (as attributes of the same names)."""
        missing = object()
        return type(component) is self.builds and all(
            getattr(component, k, missing) == v for k, v in self.settings.items()
        )

    def __repr__(self) -> str:
        given = ", ".join(f"{k}={v!r}" for k, v in self.settings.items())
        return f"<preset {self.__qualname__}: {self.builds.__qualname__}({given})>"


def preset(kind: str, name: str, builds: type, *, public: str, module: str, doc: str, **settings: Any) -> Preset:
    """Register ``name`` under ``kind`` as ``builds`` with ``settings`` as its defaults, and return the preset, to
    bind to its ``public`` name in ``module``::

        GammaTunePlus = preset("policy", "gammatune_plus", GammaTune, public="GammaTunePlus", module=__name__,
                               doc="...", threshold=0.4)

    A preset is not a subclass: what it builds is a ``builds``, which prints as one."""
    return register(kind, name)(Preset(builds, public, module, doc, settings))  # type: ignore[type-var]


def built_class(component: Any) -> type:
    """The class a registered entry builds: a class itself, or a :class:`Preset`'s ``builds``."""
    return component.builds if isinstance(component, Preset) else component


def resolve(kind: str, name: str) -> Any:
    """The class (or :class:`Preset`) registered as ``name`` under ``kind``."""
    try:
        return _kind(kind)[name]
    except KeyError:
        known = ", ".join(sorted(_REGISTRY[kind])) or "none registered"
        raise UnknownComponentError(
            f"unknown {kind} {name!r}{did_you_mean(name, _REGISTRY[kind])}; available: {known}"
        ) from None


def available(kind: str) -> list[str]:
    """Registered names of ``kind``."""
    return sorted(_kind(kind))


def _kind(kind: str) -> dict[str, type]:
    if kind not in _REGISTRY:
        raise UnknownComponentError(f"unknown component kind {kind!r}; expected one of {', '.join(KINDS)}")
    return _REGISTRY[kind]


def name_of(kind: str, component: Any) -> str:
    """The registry name of ``component``: a preset's when it holds that preset's settings (``gammatune_plus`` for a
    ``GammaTune`` with ``threshold=0.4``), else its class's (its class name when it is not registered)."""
    cls = type(component)
    for name, entry in _kind(kind).items():  # a preset whose settings the component has names it before its class
        if isinstance(entry, Preset) and entry.builds is cls and entry.matches(component):
            return name
    return next((n for n, c in _kind(kind).items() if c is cls), cls.__name__)


def build(kind: str, name: str, /, *args: Any, **kwargs: Any) -> Any:
    """Instantiate the component registered as ``name`` under ``kind`` with the given arguments.

    Raises:
        ConfigTypeError: arguments its constructor does not take (an unknown keyword, a missing required one),
            naming the component and the arguments it takes, before it is called.
    """
    factory = resolve(kind, name)
    try:
        signature = inspect.signature(factory)
    except (TypeError, ValueError):  # no introspectable signature: the call itself says
        return factory(*args, **kwargs)
    try:
        signature.bind(*args, **kwargs)
    except TypeError as error:
        raise ConfigTypeError(
            f"{kind} {name!r} ({getattr(factory, '__name__', type(factory).__name__)}): {error}; it takes "
            f"{takes(signature)}"
        ) from None
    return factory(*args, **kwargs)


def takes(signature: inspect.Signature) -> str:
    """The named parameters of ``signature``, for a message about a wrong argument (``"k, depth, width"``)."""
    names = [p.name for p in signature.parameters.values() if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    return ", ".join(names) or "no arguments"


_MAX_VALUE_REPR = 80


def readable_repr(obj: Any) -> str:
    """``Type(param=value, ...)``: the constructor's named parameters with the values of the same-named attributes
    (parameters without such an attribute, and optional ones left at their default None, are left out). A value
    without a readable repr of its own (the default ``<... object at 0x...>``, a multi-line or very long one such as
    a torch module's) prints as ``Type(...)``."""
    cls = type(obj)
    try:
        parameters = list(inspect.signature(cls).parameters.values())
    except (TypeError, ValueError):  # no introspectable signature
        parameters = []
    named = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    fields = [
        f"{p.name}={_value_repr(getattr(obj, p.name))}"
        for p in parameters
        if p.kind in named and hasattr(obj, p.name) and not (p.default is None and getattr(obj, p.name) is None)
    ]
    return f"{cls.__name__}({', '.join(fields)})"


def _value_repr(value: Any) -> str:
    if type(value).__repr__ is object.__repr__:
        return f"{type(value).__name__}(...)"
    text = repr(value)
    if "\n" in text or len(text) > _MAX_VALUE_REPR:
        return f"{type(value).__name__}(...)"
    return text
