"""Exceptions raised by decodekit.

Every error a user can trigger with bad input derives from :class:`DecodeKitError`, and its message says what
to change. Errors about arguments also derive from :class:`ValueError` so generic handlers keep working.
"""

from __future__ import annotations


class DecodeKitError(Exception):
    """Base class of all decodekit errors."""


class ConfigError(DecodeKitError, ValueError):
    """An argument or configuration value is invalid."""


class ConfigTypeError(ConfigError, TypeError):
    """An argument has the wrong type (a float where an integer is expected, a class where an instance is, ...).

    Also a :class:`TypeError`, so handlers of either kind of bad argument catch it."""


class ModelNotFoundError(ConfigError, FileNotFoundError):
    """A model name is neither a zoo name nor an existing local path (decodekit never downloads models)."""


class ComponentOutputError(ConfigError):
    """A drafter, verifier or length policy (or a diffusion sampler's rule, cache, schedule or draft strategy) returned
    a value of the wrong type, shape, dtype or range (a bug in that component); the message names the component and
    the field."""


class NoProgressError(DecodeKitError, RuntimeError):
    """A round committed no token to a row that is still generating, so the loop would never end."""


class UnknownComponentError(ConfigError):
    """A component name is not in the registry."""


class EmptyPromptError(ConfigError):
    """A prompt has no tokens."""


class ContextLengthError(ConfigError):
    """A prompt does not fit in the model's context window."""


class VocabMismatchError(ConfigError):
    """Draft and target models do not share a vocabulary."""


class IncompatibleDraftError(ConfigError):
    """A verifier was given a draft it cannot verify without bias (wrong kind or shape)."""


class MissingDependencyError(DecodeKitError, ImportError):
    """An optional package is not installed; the message gives the install command."""


class UnsupportedModelError(ConfigError):
    """A model architecture decodekit cannot run exactly (its output would differ from the model's own); the
    message names the architecture and why. See ``docs/supported-models.md``."""
