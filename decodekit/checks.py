"""Argument checks shared by decodekit's entry points (:func:`~decodekit.generate`, :func:`~decodekit.load_model`,
component constructors, the transformers bridge, the command line).

Each check raises a :class:`~decodekit.errors.ConfigError` (a ``ValueError``) whose message names the argument,
what was given and what is allowed, e.g. ``max_new_tokens must be an integer >= 1, got 2.5 (float)``; a value of
the wrong type raises :class:`~decodekit.errors.ConfigTypeError`, which is also a ``TypeError``. bools are not
integers; numpy integers are. The checks run on host values before any model work: none reads a device tensor
in the decoding loop.
"""

from __future__ import annotations

import difflib
import inspect
import math
import numbers
import sys
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch

from decodekit.errors import ConfigError, ConfigTypeError

__all__ = [
    "check_bool",
    "check_callable",
    "check_float",
    "check_instance",
    "check_int",
    "check_model_spec",  # noqa: F822 (from decodekit.models.arguments, by __getattr__)
    "check_signature",
    "describe",
    "describe_on",
    "did_you_mean",
    "eos_ids",
    "int_array",
    "int_list",
    "is_numpy_array",
    "is_int",
    "parse_device",  # noqa: F822 (from decodekit.models.arguments, by __getattr__)
    "tensor_fits",
]

INT64_RANGE = (-(2**63), 2**63 - 1)
"""What :func:`check_int` accepts at most, both ends included: a 64-bit integer, what a torch.long tensor holds."""


# ------------------------------------------------------------------------------------------------- values
def describe(value: Any) -> str:
    """``value`` for an error message: a short repr and its type, e.g. ``2.5 (float)``, ``the class FixedLength``."""
    if isinstance(value, type):
        return f"the class {value.__qualname__}"
    if isinstance(value, torch.Tensor) or is_numpy_array(value):
        kind = "tensor" if isinstance(value, torch.Tensor) else "numpy array"
        dtype = str(value.dtype).removeprefix("torch.")
        return f"a {value.ndim}-D {dtype} {kind} of shape {tuple(value.shape)}"
    text = repr(value)
    if len(text) > 60:
        text = text[:57] + "..."
    return f"{text} ({type(value).__qualname__})"


def describe_on(value: Any) -> str:
    """:func:`describe`, with the device when ``value`` is a tensor (a component output's message)."""
    return f"{describe(value)} on {value.device}" if isinstance(value, torch.Tensor) else describe(value)


def tensor_fits(value: Any, shapes: Sequence[tuple[int, ...]], device: torch.device, dtype: Any) -> bool:
    """Whether ``value`` is a tensor on ``device`` with one of ``shapes`` and of ``dtype`` (``"float"``: any floating
    point dtype): the host-metadata test of a component's output, no device read."""
    if not isinstance(value, torch.Tensor) or value.device != device or tuple(value.shape) not in shapes:
        return False
    return value.dtype.is_floating_point if dtype == "float" else value.dtype == dtype


def is_int(value: Any) -> bool:
    """An integer (Python or numpy), not a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_real(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and not _is_numpy_bool(value)


def _is_numpy_bool(value: Any) -> bool:
    numpy = sys.modules.get("numpy")
    return numpy is not None and isinstance(value, numpy.bool_)


def is_numpy_array(value: Any) -> bool:
    numpy = sys.modules.get("numpy")  # not imported: the value cannot be a numpy array
    return numpy is not None and isinstance(value, numpy.ndarray)


def int_array(array: Any, allow_bool: bool = False) -> bool:
    """Whether a tensor or numpy array holds integers (bools only when ``allow_bool``)."""
    if isinstance(array, torch.Tensor):
        dtype = array.dtype
        return not (dtype.is_floating_point or dtype.is_complex) and (allow_bool or dtype != torch.bool)
    return array.dtype.kind in ("iub" if allow_bool else "iu")


def _bounds(low: float | None, high: float | None, low_open: bool = False, high_open: bool = False) -> str:
    if low is not None and high is not None:
        return f" in {'(' if low_open else '['}{low}, {high}{')' if high_open else ']'}"
    if low is not None:
        return f" {'>' if low_open else '>='} {low}"
    if high is not None:
        return f" {'<' if high_open else '<='} {high}"
    return ""


def did_you_mean(name: str, choices: Iterable[str]) -> str:
    """``" (did you mean 'x'?)"`` for the choice closest to ``name`` (a typo's message), or ``""``."""
    close = difflib.get_close_matches(str(name), list(choices), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def check_int(
    name: str,
    value: Any,
    *,
    low: int | None = None,
    high: int | None = None,
    optional: bool = False,
    hint: str = "",
) -> int | None:
    """``value`` as an ``int``, refusing anything but an integer in ``[low, high]`` (None too when ``optional``) that
    fits in 64 bits (:data:`INT64_RANGE`: every int argument may end up in a ``torch.long`` tensor).

    Raises:
        ConfigTypeError: not an integer (a float, a bool, a string, ...).
        ConfigError: out of range, or beyond 64 bits.
    """
    if value is None and optional:
        return None
    expected = f"{'None or ' if optional else ''}an integer{_bounds(low, high)}"
    if not is_int(value):
        raise ConfigTypeError(f"{name} must be {expected}{hint}, got {describe(value)}")
    if (low is not None and value < low) or (high is not None and value > high):
        raise ConfigError(f"{name} must be {expected}{hint}, got {value!r}")
    if not INT64_RANGE[0] <= value <= INT64_RANGE[1]:  # would overflow a torch.long tensor deep in the loop
        raise ConfigError(f"{name} must be {expected}{hint} that fits in 64 bits, in [-2**63, 2**63), got {value!r}")
    return int(value)


def check_float(
    name: str,
    value: Any,
    *,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    high_open: bool = False,
    optional: bool = False,
    hint: str = "",
) -> float | None:
    """``value`` as a finite ``float`` in the given range (integers are accepted; NaN, infinities and bools are not).

    Raises:
        ConfigTypeError: not a real number.
        ConfigError: NaN, infinite or out of range.
    """
    if value is None and optional:
        return None
    expected = f"{'None or ' if optional else ''}a finite number{_bounds(low, high, low_open, high_open)}"
    if not _is_real(value):
        raise ConfigTypeError(f"{name} must be {expected}{hint}, got {describe(value)}")
    number = float(value)
    out_of_range = (
        not math.isfinite(number)
        or (low is not None and (number <= low if low_open else number < low))
        or (high is not None and (number >= high if high_open else number > high))
    )
    if out_of_range:
        raise ConfigError(f"{name} must be {expected}{hint}, got {value!r}")
    return number


def check_bool(name: str, value: Any) -> bool:
    """``value`` as a ``bool``; refuses anything but True / False (numpy bools included)."""
    if not isinstance(value, bool) and not _is_numpy_bool(value):
        raise ConfigTypeError(f"{name} must be True or False, got {describe(value)}")
    return bool(value)


def check_choice(name: str, value: Any, choices: Sequence[Any]) -> Any:
    """``value`` if it is one of ``choices``; else a :class:`ConfigError` that lists them."""
    if value not in tuple(choices):
        raise ConfigError(f"{name} must be one of {', '.join(map(repr, choices))}, got {value!r}")
    return value


def check_callable(name: str, value: Any, *, optional: bool = True, expected: str = "a callable") -> None:
    """Refuse a ``value`` that cannot be called (None is fine when ``optional``)."""
    if value is None and optional:
        return
    if not callable(value):
        raise ConfigTypeError(f"{name} must be {'None or ' if optional else ''}{expected}, got {describe(value)}")


def check_signature(name: str, value: Any, positional: int, expected: str) -> None:
    """Refuse a callable ``value`` that cannot be called with ``positional`` positional arguments, as ``expected``
    (e.g. ``"streamer(row, tokens)"``) says decodekit will call it. A callable whose signature Python cannot tell
    (some builtins) is accepted.

    Raises:
        ConfigTypeError: the signature does not take that call (too many required arguments, or too few).
    """
    try:
        signature = inspect.signature(value)
    except (TypeError, ValueError):
        return
    try:
        signature.bind(*range(positional))
    except TypeError as error:
        label = getattr(value, "__qualname__", None) or type(value).__qualname__
        raise ConfigTypeError(
            f"{name} must be callable as {expected} ({positional} positional argument{'s' * (positional != 1)}), but "
            f"{label}{signature} cannot be called that way ({error})"
        ) from None


def check_instance(name: str, value: Any, protocol: type, *, what: str = "", optional: bool = True) -> None:
    """Refuse a ``value`` that does not implement ``protocol``, and a class passed where an instance is expected.

    Args:
        name: the argument's name, for the message.
        protocol: a runtime-checkable Protocol or a class.
        what: what the protocol asks for, e.g. ``"a propose(state, budget) method"``.
        optional: None is accepted.
    """
    if value is None and optional:
        return
    if isinstance(value, type):
        raise ConfigTypeError(
            f"{name} must be an instance, got the class {value.__name__}; pass an instance: {value.__name__}()"
        )
    if not isinstance(value, protocol):
        needs = f" ({what})" if what else ""
        declared = {*getattr(protocol, "__annotations__", {}), *(n for n, v in vars(protocol).items() if callable(v))}
        lacks = ", ".join(sorted(n for n in declared if not n.startswith("_") and not hasattr(value, n)))
        got = f"got {describe(value)}" + (f"; it lacks {lacks}" if lacks else "")
        raise ConfigTypeError(f"{name} must implement the {protocol.__name__} protocol{needs}, {got}")


# -------------------------------------------------------------------------------------- generate() arguments
def eos_ids(eos_token_id: Any, vocab_size: int) -> list[int]:
    """``eos_token_id`` (an integer or a sequence of integers, each in ``[0, vocab_size)``) as a list."""
    expected = f"None, a token id in [0, {vocab_size}) or a sequence of them (() = never stop early)"
    if is_int(eos_token_id):
        ids = [eos_token_id]
    elif isinstance(eos_token_id, Iterable) and not isinstance(eos_token_id, (str, bytes, Mapping)):
        ids = int_list("eos_token_id", eos_token_id, expected)  # tensors and numpy arrays too
    else:
        raise ConfigTypeError(f"eos_token_id must be {expected}, got {describe(eos_token_id)}")
    bad = next((t for t in ids if not 0 <= t < vocab_size), None)
    if bad is not None:
        raise ConfigError(f"eos_token_id must be {expected}, got {bad} (outside the model's vocabulary)")
    return [int(t) for t in ids]


def int_list(name: str, values: Any, expected: str) -> list[Any]:
    """``values`` (an integer tensor or numpy array of at most one dimension, or an iterable of integers) as a list;
    anything else is a :class:`ConfigTypeError` saying that ``name`` must be ``expected``."""
    if isinstance(values, torch.Tensor) or is_numpy_array(values):
        if not int_array(values) or values.ndim > 1:
            raise ConfigTypeError(f"{name} must be {expected}, got {describe(values)}")
        return values.reshape(-1).tolist()
    items = list(values)
    bad = next((v for v in items if not is_int(v)), None)
    if bad is not None:
        raise ConfigTypeError(f"{name} must be {expected}; it holds {describe(bad)}")
    return items


# ------------------------------------------------------------------------------------------ models, devices
def __getattr__(name: str) -> Any:
    """``check_model_spec``, ``parse_device``: from :mod:`decodekit.models.arguments` on first use (it imports us)."""
    if name in ("check_model_spec", "parse_device"):
        from decodekit.models import arguments

        return getattr(arguments, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
