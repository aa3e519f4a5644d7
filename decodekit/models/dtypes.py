"""Dtype names from configs and command lines (``"bfloat16"``) to ``torch.dtype``: the one parser decodekit uses."""

from __future__ import annotations

import torch

from decodekit.errors import ConfigError, ConfigTypeError

__all__ = ["parse_dtype", "parse_float_dtype"]


def parse_dtype(dtype: torch.dtype | str) -> torch.dtype:
    """The ``torch.dtype`` that ``dtype`` names.

    Args:
        dtype: a ``torch.dtype`` (returned as is) or the name of one, with or without the ``torch.`` prefix:
            ``"float32"``, ``"bfloat16"``, ``"torch.float16"``, ``"half"``, ...

    Raises:
        ConfigError: ``dtype`` is neither a ``torch.dtype`` nor the name of one.
    """
    if isinstance(dtype, torch.dtype):
        return dtype
    if not isinstance(dtype, str):
        raise ConfigTypeError(
            f"dtype must be a torch.dtype or its name (e.g. 'float32', 'bfloat16'), got {dtype!r} "
            f"({type(dtype).__qualname__})"
        )
    name = dtype.strip().removeprefix("torch.")
    resolved = getattr(torch, name, None) if name.isidentifier() else None
    if isinstance(resolved, torch.dtype):
        return resolved
    raise ConfigError(
        f"unknown dtype {dtype!r}; use a torch.dtype or its name, e.g. 'float32', 'bfloat16' or 'float16'"
    )


def parse_float_dtype(dtype: torch.dtype | str) -> torch.dtype:
    """:func:`parse_dtype`, refusing dtypes a model cannot be cast to (integers, bools, complex).

    Raises:
        ConfigError: not a floating-point dtype (or not a dtype at all).
    """
    resolved = parse_dtype(dtype)
    if not resolved.is_floating_point:
        raise ConfigError(
            f"dtype must be a floating-point dtype to cast a model to (float32, bfloat16, float16, float64), "
            f"got {resolved}"
        )
    return resolved
