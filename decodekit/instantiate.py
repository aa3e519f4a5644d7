"""Config to component: Hydra's ``instantiate`` with errors that name the config key they came from."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from decodekit.errors import ConfigError, ConfigTypeError, DecodeKitError, MissingDependencyError


def build_component(cfg: Any, key: str = "component") -> Any:
    """Instantiate a component config; an empty or null config means "none / the default" (None), a non-empty one
    without ``_target_`` is refused (a misspelt ``_target_`` ran the method without its component).

    A constructor's error (a wrong-typed override such as ``policy.k=abc``) is raised as a
    :class:`~decodekit.errors.ConfigError` naming the config key, e.g. ``policy.k must be an integer >= 0, got
    'abc' (str)``, instead of Hydra's wrapped traceback.
    """
    from hydra.errors import InstantiationException
    from hydra.utils import instantiate

    if cfg is None or (isinstance(cfg, Mapping) and not len(cfg)):
        return None
    if isinstance(cfg, Mapping) and "_target_" not in cfg:  # a misspelt _target_ would run without the component
        raise ConfigError(
            f"{key} has no _target_ (it holds {', '.join(map(str, cfg))}): a component config names its class in "
            "_target_ (e.g. _target_: decodekit.drafters.NGramDrafter), or pick a config group option "
            "(e.g. drafter=ngram); {} or null means none"
        )
    if not isinstance(cfg, Mapping):
        raise ConfigTypeError(f"{key} must be a config group option or a mapping with _target_, got {cfg!r}")
    try:
        return instantiate(cfg)
    except InstantiationException as error:
        raise keyed_error(key, cfg, error) from error


def keyed_error(key: str, cfg: Any, error: Exception) -> Exception:
    """``error``'s cause with its message prefixed by the config key it came from (``key`` plus Hydra's
    ``full_key`` of a nested config); decodekit's own error classes are kept."""
    cause: BaseException = error
    full_key = ""
    while cause.__cause__ is not None and type(cause).__name__ == "InstantiationException":
        match = re.search(r"full_key: (\S+)", str(cause))
        full_key = match[1] if match else full_key
        cause = cause.__cause__
    if isinstance(cause, MissingDependencyError):
        return cause
    from omegaconf import OmegaConf

    where = full_key or key  # Hydra's full_key is the path from the root config
    root = cfg._get_root() if OmegaConf.is_config(cfg) else cfg
    node = OmegaConf.select(root, full_key) if full_key and OmegaConf.is_config(root) else cfg
    message = str(cause) if isinstance(cause, DecodeKitError) else f"{type(cause).__name__}: {cause}"
    first = message.split(" ", 1)[0]
    keys = {str(k) for k in node} if isinstance(node, Mapping) else set()
    text = f"{where}.{message}" if first in keys else f"{where}: {message}"
    if isinstance(cause, TypeError) and "unexpected keyword" in message and isinstance(node, Mapping):
        text += _takes(node.get("_target_"))
    if isinstance(cause, DecodeKitError):
        try:
            return type(cause)(text)
        except TypeError:  # an error class with another constructor
            pass
    return ConfigTypeError(text) if isinstance(cause, TypeError) else ConfigError(text)


def _takes(target: Any) -> str:
    """``"; it takes a, b"``: the keywords ``target`` (a ``_target_`` path) takes, or ``""`` when unknown."""
    import inspect

    from hydra.utils import get_object

    from decodekit.registry import takes

    try:
        signature = inspect.signature(get_object(str(target)))
    except Exception:  # not importable or not introspectable: the message stands as it is
        return ""
    return f"; it takes {takes(signature)}"


__all__ = ["build_component", "keyed_error"]
