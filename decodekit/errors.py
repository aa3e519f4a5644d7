"""Exceptions raised by decodekit.

Every error a user can trigger with bad input derives from :class:`DecodeKitError`, and its message says what
to change. Errors about arguments also derive from :class:`ValueError` so generic handlers keep working.
"""

from __future__ import annotations


class DecodeKitError(Exception):
    """Base class of all decodekit errors."""


class ConfigError(DecodeKitError, ValueError):
    """An argument or configuration value is invalid."""


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
